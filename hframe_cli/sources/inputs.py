"""Turn command-line sources (files, folders, ``-`` lists) into a sorted, checked source list.

Naming rules (``man/hframe.1``, PACK NAMES): files found under a folder argument are named
relative to that folder; files given one by one (or in a list) are named by their path as given,
as tar names them (normalized, without a leading ``/`` or ``../``), so a file's name never
depends on what else is listed; ``base`` overrides both. Names are POSIX paths kept as exact
bytes, and the list is sorted by those bytes, so the same inputs always give the same order.
"""

from __future__ import annotations

import fnmatch
import operator
import os
import re
import stat
import sys
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, BinaryIO

from ..errors import InputError
from ..locations import expand_globs, is_remote, scheme_family, shown_url
from ..names import partial_name
from .archives import ARCHIVE_KINDS, list_archive
from .compiled import scan
from .listing import Folder, sorted_entries, walk_in_parallel
from .located import reading, shown
from .objects import list_prefix, list_urls
from .sourcelist import Rejected, SourceList
from .tables import TableColumns, list_table

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FROM_KINDS", "collect_sources", "expand_braces", "expand_globs"]

DEFAULT_MAX_FRAME_BYTES = 1 << 30  # 1 GiB: 4K wallpapers and raw arrays of tens of MB are normal
#: What ``pack --from`` reads: archives (their members) and tables (their rows).
FROM_KINDS = (*ARCHIVE_KINDS, "parquet")


def read_path_list(stream: BinaryIO, null_separated: bool) -> list[str]:
    """Paths from a newline- (or NUL-) separated list, as ``os.fsdecode`` strings."""
    data = stream.read()
    parts = data.split(b"\0") if null_separated else data.splitlines()
    return [os.fsdecode(p) for p in parts if p]


def read_list(source: str, null_separated: bool, stdin: BinaryIO | None) -> list[str]:
    """The entries of the list file ``source`` (``"-"``: ``stdin``), as ``read_path_list``.

    Raises:
        InputError: the file cannot be read, or ``-`` with no standard input.
    """
    if source == "-":
        if stdin is None:
            raise InputError("'-' given but no list on standard input")
        return read_path_list(stdin, null_separated)
    try:
        with open(source, "rb") as f:
            return read_path_list(f, null_separated)
    except OSError as e:
        raise InputError(f"{source}: cannot read the list: {e.strerror}") from None


def _is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class _Collector:
    def __init__(
        self,
        *,
        include: Sequence[str],
        exclude: Sequence[str],
        skip_bad: bool,
        max_frame_bytes: int,
        allow_empty: bool,
        forbidden: Sequence[str],
    ) -> None:
        self.include = list(include)
        self.exclude = list(exclude)
        self.skip_bad = skip_bad
        self.max_frame_bytes = max_frame_bytes
        self.allow_empty = allow_empty
        self.forbidden = {os.path.realpath(p) for p in forbidden}
        self.forbidden_names = {os.path.basename(p) for p in forbidden}
        self.out = SourceList()

    def reject(self, path: str, reason: str) -> None:
        if not self.skip_bad:
            raise InputError(f"{path}: {reason} (use --skip-bad to leave it out)")
        self.out.rejected.append(Rejected(path, reason))

    def wanted(self, name: str) -> bool:
        if not self.include and not self.exclude:
            return True
        if self.include and not any(fnmatch.fnmatchcase(name, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.exclude)

    def add_file(self, path: str, name: str, st: os.stat_result | None = None) -> None:
        if not self.wanted(name):
            return
        try:
            st = st or os.stat(path)
        except FileNotFoundError:
            kind = "broken symlink" if os.path.islink(path) else "no such file"
            self.reject(path, kind)
            return
        except OSError as e:
            self.reject(path, f"cannot stat: {e.strerror}")
            return
        if not stat.S_ISREG(st.st_mode):
            self.reject(path, "not a regular file")
            return
        if path.rpartition(os.sep)[2] in self.forbidden_names and os.path.realpath(path) in self.forbidden:
            raise InputError(f"{path}: is the output being written; put the output outside the input tree")
        if st.st_size == 0 and not self.allow_empty:
            self.reject(path, "zero-byte file (use --allow-empty to pack it)")
            return
        if st.st_size > self.max_frame_bytes:
            self.reject(path, f"{st.st_size} bytes is larger than --max-frame-bytes {self.max_frame_bytes}")
            return
        self.out.add(path, os.fsencode(name), st.st_size, st.st_mtime_ns)

    def add_archive(self, path: str, kind: str, label_ext: str | None = None) -> None:
        """Add the regular members of the archive ``path`` (``archives.list_archive``), named by
        their paths in it. Links, devices and names with ``..`` are skipped with a line each (as
        ``tar xf`` would not make them files); of two members with one name the later one is
        kept, as extracting the archive keeps it."""
        if os.path.realpath(path) in self.forbidden:
            raise InputError(f"{path}: is the output being written")
        try:
            self._add_members(path, kind, label_ext)
        except InputError as e:  # damaged or truncated: with --skip-bad, the members before it stay
            if not self.skip_bad:
                raise
            why = str(e).removeprefix(f"{path}: ")
            self.out.rejected.append(Rejected(path, f"{why}; the members before the damage are kept"))

    def _add_members(self, path: str, kind: str, label_ext: str | None) -> None:
        seen: dict[bytes, int] = {}
        paths, names, sizes, mtimes = self.out.columns()
        for e in list_archive(path, kind, label_ext):
            if e.problem is not None:
                if e.problem:
                    self.out.rejected.append(Rejected(shown(e.path), e.problem))
                continue
            if not self.wanted(e.name):
                continue
            if e.size == 0 and not self.allow_empty:
                self.reject(shown(e.path), "zero-byte member (use --allow-empty to pack it)")
                continue
            if e.size > self.max_frame_bytes:
                self.reject(shown(e.path), f"{e.size} bytes is larger than --max-frame-bytes {self.max_frame_bytes}")
                continue
            name = os.fsencode(e.name)
            k = seen.get(name)
            if k is not None:
                self.out.rejected.append(
                    Rejected(shown(paths[k]), "replaced by a later member of the same name (as tar xf does)")
                )
                paths[k], sizes[k], mtimes[k] = e.path, e.size, e.mtime_ns
                continue
            seen[name] = len(names)
            self.out.add(e.path, name, e.size, e.mtime_ns)

    def add_located(self, entry: Any) -> bool:
        """Add one member, row or object found by a listing (an ``ArchiveEntry``, ``TableRow``
        or ``ObjectEntry``) after the checks a file gets; False if it was left out."""
        if entry.problem is not None:  # not a frame (a link, a null, a '..' name): said, never fatal
            if entry.problem:
                self.out.rejected.append(Rejected(shown(entry.path), entry.problem))
            return False
        if not self.wanted(entry.name):
            return False
        if entry.size == 0 and not self.allow_empty:
            self.reject(shown(entry.path), "zero bytes (use --allow-empty to pack it)")
            return False
        if entry.size > self.max_frame_bytes:
            self.reject(
                shown(entry.path), f"{entry.size} bytes is larger than --max-frame-bytes {self.max_frame_bytes}"
            )
            return False
        self.out.add(entry.path, os.fsencode(entry.name), entry.size, entry.mtime_ns)
        return True

    def add_table(self, path: str, columns: TableColumns) -> None:
        """Add the rows of the Parquet table ``path`` (``tables.list_table``), in table order."""
        if os.path.realpath(path) in self.forbidden:
            raise InputError(f"{path}: is the output being written")
        for row in list_table(path, columns):
            self.add_located(row)

    def add_prefix(self, location: str) -> None:
        """Add the objects under an object-store prefix (``objects.list_prefix``), named by
        their keys relative to it."""
        for entry in list_prefix(location):
            self.add_located(entry)

    def add_tree(self, root: str, base: str) -> None:
        """Add the files under ``root``, named relative to ``base``: a depth-first walk following
        symlinks, the chain of real folders kept to spot loops. A big tree is listed by several
        processes (``listing``); the sources, rejections and first error are the same."""
        prefix = os.path.relpath(root, base)
        prefix = "" if prefix == os.curdir else prefix.replace(os.sep, "/") + "/"
        st = os.stat(root)
        top: Folder = (root, prefix, ((st.st_dev, st.st_ino),))
        if not walk_in_parallel(self, top):
            self.walk([top])

    def scan(self, folder: str) -> list[os.DirEntry[str]] | None:
        """The entries of ``folder`` sorted by name, or None (rejected) when it cannot be listed."""
        try:
            return sorted_entries(folder)
        except OSError as e:
            self.reject(folder, f"cannot list folder: {e.strerror}")
            return None

    def walk(self, stack: list[Folder]) -> None:
        """Walk the folders on ``stack`` depth-first, popping the last first. A folder of plain
        files only is listed by the compiled part where it was built (``compiled.scan``: the
        same sources in the same order); it declines any other, listed here."""
        listed_whole = scan.scan_files if scan is not None and not self.include and not self.exclude else None
        forbidden = tuple(os.fsencode(n) for n in self.forbidden_names)
        while stack:
            folder = stack.pop()
            if listed_whole is not None and listed_whole(
                folder[0], os.fsencode(folder[1]), self.max_frame_bytes, forbidden, *self.out.columns()
            ):
                continue
            entries = self.scan(folder[0])
            if entries is not None:
                self.add_entries(folder, entries, stack)

    def add_entries(self, folder: Folder, entries: Iterable[os.DirEntry[str]], stack: list[Folder]) -> None:
        """Add the files among ``entries`` (of ``folder``), in order; push its subfolders on
        ``stack`` so that the walk pops them in name order (the sources then mostly come out
        sorted, and ``collect_sources`` need not reorder them)."""
        prefix = folder[1]
        pushed = len(stack)
        # the common case, a plain regular file with no globs to match, is taken inline: the rest
        # (symlinks, special files, empty or oversized files, the output itself) goes through
        # add_file, which applies every rule
        plain = not self.include and not self.exclude
        forbidden_names, max_bytes = self.forbidden_names, self.max_frame_bytes
        paths, names, sizes, mtimes = self.out.columns()  # appended to in step, without an object per file
        add_path, add_name, add_size, add_mtime = paths.append, names.append, sizes.append, mtimes.append
        fs_encoding, fs_errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # = os.fsencode
        for entry in entries:
            path = entry.path
            if plain:
                try:
                    if entry.is_file(follow_symlinks=False) and entry.name not in forbidden_names:
                        est = entry.stat(follow_symlinks=False)
                        size = est.st_size
                        if 0 < size <= max_bytes:
                            add_path(path)
                            add_name((prefix + entry.name).encode(fs_encoding, fs_errors))
                            add_size(size)
                            add_mtime(est.st_mtime_ns)
                            continue
                except OSError:
                    pass  # the careful path below says what is wrong
            sub = self.subfolder(folder, entry)
            if sub is not None:
                if sub:
                    stack.append(sub)
                continue
            if entry.is_symlink():
                try:
                    est = os.stat(path)
                except OSError as e:
                    reason = "symlink loop" if e.errno == 40 else "broken symlink"
                    self.reject(path, reason)
                    continue
                self.add_file(path, prefix + entry.name, est)
            else:
                try:
                    est = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    self.reject(path, "vanished while listing")
                    continue
                except OSError as e:  # a folder whose names can be read but not stat'ed (no x bit)
                    self.reject(path, f"cannot stat: {e.strerror}")
                    continue
                self.add_file(path, prefix + entry.name, est)
        stack[pushed:] = stack[pushed:][::-1]

    def subfolder(self, folder: Folder, entry: os.DirEntry[str], reject: bool = True) -> Folder | tuple[()] | None:
        """``entry`` of ``folder`` as a folder to walk; ``()`` for a folder rejected (it cannot be
        stat'ed, or links back to a folder above it; ``reject=False`` only says so); None when it
        is not a folder."""
        try:
            if not entry.is_dir(follow_symlinks=True):
                return None
        except OSError:
            return None
        _, prefix, chain = folder
        try:
            est = os.stat(entry.path)
        except OSError as e:
            if reject:
                self.reject(entry.path, f"cannot stat: {e.strerror}")
            return ()
        key = (est.st_dev, est.st_ino)
        if key in chain:
            if reject:
                self.reject(entry.path, "symlink loop (links back to a folder above it)")
            return ()
        return (entry.path, prefix + entry.name + "/", (*chain, key))


def collect_sources(
    args: Iterable[str],
    *,
    stdin: BinaryIO | None = None,
    null_separated: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    base: str | None = None,
    output: str | None = None,
    skip_bad: bool = False,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    allow_empty: bool = False,
    require_some: bool = True,
    archives: str | None = None,
    table_columns: TableColumns | None = None,
    label_member: str | None = None,
) -> SourceList:
    """Expand sources into a sorted list of files to pack.

    Args:
        args: files, folders (walked recursively, following symlinks), object-store prefixes
            (``s3://bucket/prefix/``: the objects under them, as a folder's files), or ``-``
            for a list on ``stdin``; with ``archives``, archive or table files (globs and
            ``{000..099}`` ranges expanded) whose members or rows are the sources.
        archives: ``tar``, ``zip`` or ``parquet`` (``FROM_KINDS``): every argument is such a
            file (``pack --from``).
        table_columns: with ``parquet``: the columns of the bytes, names and labels.
        label_member: with ``tar`` or ``zip``: ``EXT`` of ``--label-from .EXT``, the member of
            each sample that holds its label.
        null_separated: the stdin list is NUL-separated (``find -print0``).
        include, exclude: shell globs matched against the name in the pack.
        base: name every file relative to this folder.
        output: the pack being written; an output inside an input folder is refused.
        skip_bad: leave bad inputs out (listed in ``rejected``) instead of raising.
        require_some: raise if no file is left (off to list folders that may be empty).

    Raises:
        InputError: a bad input (without ``skip_bad``), a duplicate name, or no input at all.
    """
    forbidden = [output, partial_name(output)] if output else []
    col = _Collector(
        include=include,
        exclude=exclude,
        skip_bad=skip_bad,
        max_frame_bytes=max_frame_bytes,
        allow_empty=allow_empty,
        forbidden=forbidden,
    )
    if archives is not None:
        return _collect_archives(
            col,
            list(args),
            archives,
            table_columns,
            include,
            exclude,
            allow_empty,
            max_frame_bytes,
            output,
            require_some,
            label_member,
        )
    files: list[str] = []
    folders: list[str] = []
    prefixes: list[str] = []
    urls: list[str] = []
    url_base = base if base is not None and scheme_family(base) == "http" else None
    if url_base is not None:
        base = None
    for arg in args:
        family = scheme_family(arg)
        if family == "object":
            if base is not None or url_base is not None:
                raise InputError(f"--base with {shown_url(arg)}: objects are named by their keys under the prefix")
            prefixes.append(arg)
        elif family == "http":
            if arg.split("?", 1)[0].endswith("/"):
                raise InputError(
                    f"{shown_url(arg)}: HTTP has no listing; give the URLs of its files "
                    "(one per line on standard input: hframe pack - < urls.txt)"
                )
            urls.append(arg)
        elif family != "file":
            raise InputError(
                f"{shown_url(arg)}: hframe lists s3://, gs:// and hdfs:// prefixes; not a location it can list"
            )
        elif arg == "-":
            for entry in read_list("-", null_separated, stdin):
                (urls if is_remote(entry) else files).append(entry)
        elif os.path.isdir(arg):
            folders.append(arg)
        elif not os.path.lexists(arg) and not skip_bad:
            # a typo on the command line, not a bad file met in a tree or a list: no hint
            raise InputError(f"{shown_url(arg)}: no such file or folder")
        else:
            files.append(arg)
    out_real = os.path.realpath(output) if output else None
    for folder in folders:
        if out_real and _is_under(out_real, os.path.realpath(folder)):
            raise InputError(f"{output}: output is inside the input folder {folder}; write it elsewhere")
        root_base = base if base is not None else folder
        col.add_tree(folder, root_base)
    if files:
        for path, rel in zip(files, _relative_names(files, base)):
            if rel.startswith(".." + os.sep) or rel == "..":
                raise InputError(f"{path}: not under --base {base}")
            if rel in (".", ""):
                raise InputError(f"{path}: is --base itself, so it would have no name; give its folder as --base")
            col.add_file(path, rel.replace(os.sep, "/"))
    if base is not None:
        for folder in folders:
            if os.path.relpath(folder, base).startswith(".."):
                raise InputError(f"{folder}: not under --base {base}")
    for prefix in prefixes:
        col.add_prefix(prefix)
    if urls:
        if base is not None:
            raise InputError(f"--base {base} with {shown_url(urls[0])}: give --base a URL that the URLs are under")
        for found in list_urls(urls, url_base):
            if found.problem:  # (a file the list names that is not there: as a missing file is)
                col.reject(found.path, found.problem)
            else:
                col.add_located(found)
    elif url_base is not None:
        raise InputError(f"--base {shown_url(url_base)}: a URL as --base names files at URLs; none is given")
    _sort_by_name(col)
    col.out.collect = {
        "folders": [os.path.abspath(f) for f in folders],
        "prefixes": prefixes,
        "include": list(include),
        "exclude": list(exclude),
        "base": os.path.abspath(base) if base is not None else None,
        "allow_empty": allow_empty,
        "max_frame_bytes": max_frame_bytes,
        "output": os.path.abspath(output) if output else None,
    }
    if not len(col.out) and require_some:
        if prefixes and not files and not folders and not col.out.rejected:
            raise InputError(f"nothing to pack: {' '.join(map(shown_url, prefixes))} lists no objects")
        raise InputError("nothing to pack: no input files" + (" left after --skip-bad" if col.out.rejected else ""))
    return col.out


def _collect_archives(
    col: _Collector,
    args: list[str],
    kind: str,
    columns: TableColumns | None,
    include: Sequence[str],
    exclude: Sequence[str],
    allow_empty: bool,
    max_frame_bytes: int,
    output: str | None,
    require_some: bool,
    label_member: str | None = None,
) -> SourceList:
    """``collect_sources`` with ``archives``: the members of every archive, sorted by name (a
    name in two archives is refused, as a name in two folders is); or the rows of every table,
    in table order (``tables.py`` says why), a name given twice refused."""
    if kind not in FROM_KINDS:
        raise InputError(f"--from {kind}: hframe reads {', '.join(FROM_KINDS)} files")
    if (kind == "parquet") != (columns is not None):
        raise InputError(
            "--from parquet needs --column (the column of the frames' bytes)"
            if kind == "parquet"
            else f"--column, --name-column and --label-column are for --from parquet, not --from {kind}"
        )
    found: list[str] = []
    for arg in args:
        if arg == "-":
            raise InputError(f"--from {kind} -: standard input is read by 'hframe pack' (api.pack), not here")
        if scheme_family(arg) != "file":  # archives at URLs: ranges expanded, no globs (no listing)
            if kind != "tar":
                raise InputError(f"{shown_url(arg)}: --from {kind} reads files on this machine; copy it first")
            found.extend(expand_braces(arg))
            continue
        for path in expand_globs(expand_braces(arg)):
            if not os.path.lexists(path):
                raise InputError(f"{shown_url(path)}: no such file")
            if os.path.isdir(path):
                what = "rows of Parquet" if kind == "parquet" else f"members of {kind}"
                raise InputError(f"{path}: is a folder; --from {kind} packs the {what} files")
            found.append(os.path.abspath(path))
    forward = False
    for path in found:
        if columns is not None:
            col.add_table(path, columns)
        else:
            before = len(col.out)
            col.add_archive(path, kind, label_member)
            forward = forward or (len(col.out) > before and reading(col.out.paths[before]) == "forward")
    if columns is not None or forward:
        # rows and a compressed tar's members keep their order: a row group is decoded once,
        # a compressed stream is read forward (tables.py, streams.py)
        _refuse_repeated_names(col, "without --name-column, rows are named by number" if columns else "")
    else:
        _sort_by_name(col)
    col.out.collect = {
        "archives": found,
        "archive_kind": kind,
        "table_columns": columns.to_dict() if columns is not None else None,
        "label_member": label_member,
        "folders": [],
        "include": list(include),
        "exclude": list(exclude),
        "allow_empty": allow_empty,
        "max_frame_bytes": max_frame_bytes,
        "output": os.path.abspath(output) if output else None,
    }
    if not len(col.out) and require_some:
        what = "rows" if kind == "parquet" else "regular members"
        raise InputError(f"nothing to pack: no {what} in {' '.join(args)}")
    return col.out


_MAX_BRACE_ITEMS = 1_000_000


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's shard ranges: ``train-{000000..000099}.tar`` (zero-padded as written) and
    ``{a,b}`` lists, expanded as a shell would, left to right; anything else stays as it is."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}|\{([^{}]*,[^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if m.group(3) is not None:
        items = m.group(3).split(",")
    else:
        lo, hi = m.group(1), m.group(2)
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        step = 1 if int(hi) >= int(lo) else -1
        if abs(int(hi) - int(lo)) >= _MAX_BRACE_ITEMS:
            raise InputError(f"{pattern}: a range of more than {_MAX_BRACE_ITEMS:,} names")
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + step, step)]
    return [x for item in items for x in expand_braces(head + item + tail)]


def _sort_by_name(col: _Collector) -> None:
    """Put the sources in name order (stable: of two files with one name, the first found is
    kept, the other rejected), on the columns: a sort of positions by name, and each column
    taken in that order once, unless it is already sorted. A walk of folders that hold either
    files or folders gives the names in order already: checked in one pass, which also shows
    that no name appears twice."""
    columns = col.out.columns()
    paths, names = columns[0], columns[1]
    if all(map(operator.lt, names, islice(names, 1, None))):  # (bytes.__lt__ is slower, and would
        # take the NotImplemented it returns for a name that is not bytes as true)
        return
    order = sorted(range(len(names)), key=names.__getitem__)
    if order != list(range(len(order))):
        _reorder(columns, order)
    if any(map(operator.eq, names[1:], names)):  # rare: the slow path names each duplicate
        keep = [True] * len(names)
        first = 0
        for j in range(1, len(names)):
            if names[j] != names[first]:
                first = j
                continue
            col.reject(
                shown(paths[j]),
                f"name {names[j].decode('utf-8', 'backslashreplace')!r} appears twice "
                f"(also {shown(paths[first])}); use --base or separate packs",
            )
            keep[j] = False
        _reorder(columns, [j for j, k in enumerate(keep) if k])


def _refuse_repeated_names(col: _Collector, hint: str) -> None:
    """Sources keep their order; a name given again is refused (with ``--skip-bad``: left out)."""
    paths, names = col.out.columns()[:2]
    first: dict[bytes, int] = {}
    drop: list[int] = []
    for j, name in enumerate(names):
        k = first.setdefault(name, j)
        if k != j:
            col.reject(
                shown(paths[j]),
                f"name {name.decode('utf-8', 'backslashreplace')!r} is given again (first by {shown(paths[k])}); "
                f"names must be unique{f' ({hint})' if hint else ''}",
            )
            drop.append(j)
    if drop:
        gone = set(drop)
        _reorder(col.out.columns(), [j for j in range(len(names)) if j not in gone])


def _reorder(columns: tuple[list[Any], ...], positions: list[int]) -> None:
    """Each column in place: its items at ``positions``, in that order."""
    for column in columns:
        column[:] = [column[i] for i in positions]


def _relative_names(files: Sequence[str], base: str | None) -> list[str]:
    """Each file's name: relative to ``base``, or else its path as given, as tar names it.

    Without ``base``: ``normpath`` (``./`` and ``x/..`` go), then leading ``/`` and ``../`` are
    dropped (tar's "Removing leading '/' from member names"): ``/data/a.jpg`` is ``data/a.jpg``
    and ``photos/cats/a.jpg`` stays as it is, whatever else is listed. With ``base``: relative to
    it, on the strings when paths and ``base`` are of one kind (relative or absolute), on absolute
    paths otherwise; a file outside ``base`` starts with ``..`` (the caller refuses it).
    """
    norm = [os.path.normpath(f) for f in files]
    if base is None:
        return [_tar_name(p) for p in norm]
    if len({os.path.isabs(p) for p in norm} | {os.path.isabs(base)}) > 1:
        norm = [os.path.abspath(p) for p in norm]
        base = os.path.abspath(base)
    root = os.path.normpath(base)
    if root == os.curdir:
        return norm
    cut = len(root) + (0 if root.endswith(os.sep) else 1)
    return [
        p[cut:]
        if p.startswith(root) and p[len(root) : len(root) + 1] in (os.sep, "") and p != root
        else os.path.relpath(p, root)
        for p in norm
    ]


def _tar_name(path: str) -> str:
    name = path.lstrip(os.sep)
    while name == os.pardir or name.startswith(os.pardir + os.sep):
        name = name[len(os.pardir) + 1 :].lstrip(os.sep)
    return name
