"""``hframe mount``: a pack, a dataset or a remote pack as a read-only folder (FUSE).

The tree is the frames' names (``a/b/c.jpg``: folders ``a`` and ``a/b``), each file's size the
frame's size (decompressed; ``--stored``: as stored) and its mtime the source's, from the
index. The mount answers no ``open`` where the kernel allows it: the kernel then opens and
closes files by itself and keeps each file's pages while mounted, so a file is read from the
pack once. A read of a file is ``PackReader.read_part``: one ``pread`` of the pack for a frame
stored as it is, one ranged GET for a remote one (or the node cache's copy); a compressed frame
is decompressed once and kept among the last few. Every read goes through the one reader opened
at mount time, which holds its pack generation: a pack republished while mounted keeps serving
the old generation's bytes (a local pack's open file), or its reads fail with EIO and a log
line (a remote pack pinned to its ETag), never a mix of the two.

The file system runs on libfuse 3 through mfusepy (the binding ratarmount uses), both optional:
``check_mountable`` says in one line what is missing (the package, the library, ``/dev/fuse``)
before anything is mounted. In the foreground (the default) Ctrl-C or SIGTERM unmounts; with
``background`` the command starts itself in the foreground in a new session and returns once
the folder is mounted (or says why it could not be). ``unmount`` is ``fusermount3 -u``.

Imports inside functions: mfusepy loads libfuse when imported, so only a mount imports it.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any

import pyarrow as pa

from ..errors import InputError, StorageError
from .dataset import open_pack

__all__ = ["MountTree", "check_mountable", "is_mounted", "mount", "unmount"]

#: decompressed frames kept for the reads that follow (a big frame is read in 128 KiB pieces)
KEEP_DECODED = 8
#: libfuse's ``FUSE_CAP_NO_OPEN_SUPPORT``: the kernel takes ENOSYS from ``open`` as "opens need
#: no answer" (Linux >= 4.19)
_FUSE_CAP_NO_OPEN_SUPPORT = 1 << 17
#: how long ``mount(background=True)`` waits for the folder to be mounted
READY_WITHIN_S = 30.0


class MountTree:
    """The folder tree of a pack's frame names: paths (bytes, from ``/``) to frame ids, and the
    folders with their entries."""

    def __init__(self, names: list[bytes], sizes: list[int], mtimes_ns: list[int]) -> None:
        self.files: dict[bytes, int] = {}
        self.sizes, self.mtimes_ns = sizes, mtimes_ns
        self.folders: dict[bytes, dict[bytes, None]] = {b"/": {}}
        for i, name in enumerate(names):
            parts = [p for p in name.split(b"/") if p not in (b"", b".", b"..")]
            if not parts:
                continue
            folder = b"/"
            for part in parts[:-1]:
                child = folder.rstrip(b"/") + b"/" + part
                if child in self.files:  # a frame named as a folder of another: the file wins
                    break
                self.folders[folder].setdefault(part, None)
                self.folders.setdefault(child, {})
                folder = child
            else:
                path = folder.rstrip(b"/") + b"/" + parts[-1]
                if path not in self.folders and path not in self.files:  # (the first of two same names)
                    self.files[path] = i
                    self.folders[folder].setdefault(parts[-1], None)


def check_mountable(mountpoint: str) -> None:
    """Refuse, before anything is opened, a mount that cannot work.

    Raises:
        InputError: the mount point is missing, not a folder, or not empty (exit 2).
        StorageError: no ``/dev/fuse``, no mfusepy or libfuse 3 (exit 3).
    """
    if not os.path.exists(mountpoint):
        raise InputError(f"{mountpoint}: no such folder (make it first: mkdir -p {mountpoint})")
    if not os.path.isdir(mountpoint):
        raise InputError(f"{mountpoint}: not a folder")
    if is_mounted(mountpoint):
        raise InputError(f"{mountpoint}: something is mounted there already (hframe umount {mountpoint})")
    if os.listdir(mountpoint):
        raise InputError(f"{mountpoint}: not empty (mount on an empty folder: its files would be hidden)")
    if not os.path.exists("/dev/fuse"):
        raise StorageError("/dev/fuse: not there (FUSE needs it: a container must be given the device)")
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        raise StorageError("hframe mount needs mfusepy: pip install 'hframe[mount]'") from None
    except OSError as e:  # (mfusepy finds no libfuse)
        raise StorageError(f"hframe mount needs libfuse 3: apt-get install fuse3 ({e})") from None


def mount(
    source: str,
    mountpoint: str,
    *,
    stored: bool = False,
    background: bool = False,
    argv: list[str] | None = None,
) -> None:
    """Mount ``source`` (a pack, a dataset, a remote pack) read-only on ``mountpoint``: in the
    foreground until unmounted (Ctrl-C, SIGTERM, ``hframe umount``), or with ``background`` in
    a process of its own, returning when the folder is mounted.

    Raises:
        InputError, StorageError: as ``check_mountable``; the source cannot be opened.
    """
    check_mountable(mountpoint)
    if background:
        _in_background(mountpoint, argv or [])
        return
    import mfusepy

    reader = open_pack(source)
    remote = "://" in source
    try:
        table = reader.table
        names = [
            raw if raw is not None else name.encode("utf-8", "surrogateescape")
            for name, raw in zip(table.column("name").to_pylist(), table.column("name_raw").to_pylist())
        ]
        sizes = table.column("length" if stored else "raw_length").to_pylist()
        mtimes = [us * 1000 for us in table.column("source_mtime").cast(pa.int64()).to_pylist()]
        codecs = table.column("codec").to_pylist()
        tree = MountTree(names, sizes, mtimes)
        ops = _Operations(reader, tree, stored, [c not in (None, "none") for c in codecs], source)
        # libfuse ends its loop (and unmounts) on SIGINT, SIGTERM and SIGHUP, but only installs its
        # handler where none is: hframe's own (signals.py) are set aside while mounted
        saved = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            # one thread for a local pack (each request a pread: the kernel's round trip is the
            # cost, and handing requests between threads under the GIL would add to it); threads
            # for a remote one, whose requests wait on the network
            # the tree and the bytes never change while mounted (one generation): the kernel may
            # keep names, attributes and pages as long as it likes
            mfusepy.FUSE(
                ops,
                mountpoint,
                foreground=True,
                ro=True,
                nothreads=not remote,
                fsname="hframe",
                kernel_cache=True,
                attr_timeout=86400,
                entry_timeout=86400,
                negative_timeout=86400,
                # (libfuse 3.14 says "Ignoring invalid max threads value" when this is left unset)
                **({} if not remote else {"max_idle_threads": 10}),
            )
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    finally:
        reader.close()


def _in_background(mountpoint: str, argv: list[str]) -> None:
    """Run this command again in the foreground, in a new session with its output to the log,
    and wait until ``mountpoint`` is mounted (or that process has ended: its error is said)."""
    args = [a for a in argv if a not in ("--background", "-b")]
    where = os.path.abspath(mountpoint).replace("/", "_")
    log_path = os.path.join(tempfile.gettempdir(), f"hframe-mount-{os.getuid()}{where}.log")  # (its errors, EIOs)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hframe_cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return
        if proc.poll() is not None:
            with open(log_path, encoding="utf-8", errors="replace") as f:
                said = f.read().strip().splitlines()
            why = said[-1].removeprefix("hframe: error: ") if said else f"{mountpoint}: the mount ended at once"
            # (its exit status says which kind: a store that cannot be read is 3, as it would be here)
            raise (StorageError if proc.returncode == StorageError.exit_code else InputError)(why)
        time.sleep(0.02)
    proc.kill()
    raise StorageError(f"{mountpoint}: not mounted within {READY_WITHIN_S:g} s")


def is_mounted(mountpoint: str) -> bool:
    """Whether something is mounted on ``mountpoint``, by the kernel's table (``/proc/self/mounts``):
    a mount whose server died answers no ``stat`` ("not connected"), so ``os.path.ismount``
    misses it, but it is still there and must be unmounted."""
    where = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
            points = [line.split()[1] for line in f if len(line.split()) > 1]
    except OSError:
        return os.path.ismount(where)
    return any(_unescaped(p) == where for p in points)


def _unescaped(field: str) -> str:
    """A path of the mounts table as it is (the kernel writes space, tab, newline and backslash
    as octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def unmount(mountpoint: str) -> None:
    """Unmount an ``hframe mount`` (``fusermount3 -u``; as root, ``umount`` where that is missing).

    Raises:
        InputError: nothing is mounted there.
        StorageError: the unmount failed (busy: a process has a file open there).
    """
    if not is_mounted(mountpoint):
        raise InputError(f"{mountpoint}: nothing is mounted there")
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", mountpoint] if tool else ["umount", mountpoint]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise StorageError(f"{mountpoint}: could not unmount ({' '.join(r.stderr.split()) or r.returncode})")


class _Operations:
    """The FUSE callbacks (mfusepy's ``Operations`` protocol): read-only, one reader. Every
    public name is a callback to mfusepy (an attribute named ``lock`` would be taken for the
    ``lock`` operation): state is kept in ``_`` names."""

    use_ns = True

    def __init__(self, reader: Any, tree: MountTree, stored: bool, compressed: list[bool], source: str) -> None:
        self._reader, self._tree, self._stored, self._compressed, self._source = (
            reader,
            tree,
            stored,
            compressed,
            source,
        )
        self._decoded: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._no_open = False
        now = time.time_ns()
        self._uid, self._gid, self._now = os.getuid(), os.getgid(), now

    def _path(self, path: str) -> bytes:
        return path.encode("utf-8", "surrogateescape")

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        p = self._path(path)
        tree = self._tree
        i = tree.files.get(p)
        base = {"st_uid": self._uid, "st_gid": self._gid}
        if i is not None:
            t = tree.mtimes_ns[i]
            return {
                **base,
                "st_mode": stat.S_IFREG | 0o444,
                "st_nlink": 1,
                "st_size": tree.sizes[i],
                "st_mtime": t,
                "st_ctime": t,
                "st_atime": t,
            }
        if p in tree.folders or p == b"/":
            return {
                **base,
                "st_mode": stat.S_IFDIR | 0o555,
                "st_nlink": 2,
                "st_size": 0,
                "st_mtime": self._now,
                "st_ctime": self._now,
                "st_atime": self._now,
            }
        raise _fuse_error(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        entries = self._tree.folders.get(self._path(path))
        if entries is None:
            raise _fuse_error(errno.ENOTDIR)
        return [".", "..", *(e.decode("utf-8", "surrogateescape") for e in entries)]

    def init_with_config(self, conn: Any, config: Any) -> None:
        self._no_open = bool(conn is not None and conn.capable & _FUSE_CAP_NO_OPEN_SUPPORT)

    def open(self, path: str, flags: int) -> int:
        # "no open" (Linux >= 4.19): the kernel takes ENOSYS for success and sends no more opens
        # or releases (nor, after its first ENOSYS, flushes), keeping the pages of a file across
        # opens (FOPEN_KEEP_CACHE). Reads name the file by its path. Writes never get here: the
        # mount is read-only (EROFS from the kernel).
        if self._no_open:
            raise _fuse_error(errno.ENOSYS)
        if self._tree.files.get(self._path(path)) is None:
            raise _fuse_error(errno.ENOENT)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        i = self._tree.files.get(self._path(path))
        if i is None:
            raise _fuse_error(errno.ENOENT)
        try:
            if self._compressed[i] and not self._stored:
                with self._lock:
                    data = self._decoded.get(i)
                    if data is not None:
                        self._decoded.move_to_end(i)
                if data is None:
                    data = self._reader.read(i)
                    with self._lock:
                        self._decoded[i] = data
                        while len(self._decoded) > KEEP_DECODED:
                            self._decoded.popitem(last=False)
                return data[offset : offset + size]
            return bytes(self._reader.read_part(i, offset, size, self._stored))
        except Exception as e:  # (the pack was replaced, the store failed: EIO, said in the log)
            sys.stderr.write(f"hframe mount: {path}: frame {i} of {self._source}: {e}\n")
            raise _fuse_error(errno.EIO) from None

    def flush(self, path: str, fh: int) -> int:
        raise _fuse_error(errno.ENOSYS)  # (nothing is written: the kernel stops asking)

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0, "f_namemax": 255}


def _fuse_error(code: int) -> Exception:
    import mfusepy

    return mfusepy.FuseOSError(code)  # type: ignore[no-any-return]
