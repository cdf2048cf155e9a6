"""The ``hframe`` console script's first lines: SIGINT and SIGTERM mean "stop" from the start.

Until a command installs its own handling (``guard.stop_signals``), both raise
``KeyboardInterrupt`` (``signals.install_early``), which ``cli.app.main`` turns into one line and
exit 130; a signal that arrives while the command's modules are still being imported ends the
process the same way, not with a traceback (SIGINT) or a bare -15 (SIGTERM).

BLAS threads: pyarrow imports numpy when it is installed (nearly every ML environment), and
numpy's OpenBLAS starts a pool of threads at import. hframe does no linear algebra, and a
process with threads it does not know cannot fork its packing workers and loader safely
(``processes.fork_is_safe``): they were silently left out, and packing ran in one process. So
the command asks OpenBLAS for no pool (``OPENBLAS_NUM_THREADS=1``) unless the user set it.

numpy: pyarrow imports it, when installed, as its extension module starts (70-110 ms, and
numpy's BLAS); hframe gives pyarrow no numpy arrays, so the command's pyarrow is told numpy is
not there (``_NoNumpyForArrow``); anything else may still import numpy.

pandas: pyarrow imports it (about 0.3 s, and pyarrow.compute with it) the first time it makes an
array or table from Python values, only to ask whether they are a DataFrame. hframe uses no
pandas, so the command's process finds none (``_NoPandas``) unless something imported it
already; a library caller's process is left as it is.

malloc: the command's process is ours, so it keeps freed heap (``processes.keep_freed_heap``,
unless ``HFRAME_MALLOC=0`` or a ``MALLOC_*`` threshold is set): a remote read's answers are
megabytes of new ``bytes`` freed right after (into the node cache, out to a file), which glibc
would give back to the kernel each time, and the next answer would fault every page in again.
``hframe prefetch`` of a whole 687 MB pack from nginx on loopback: 2.0-2.1 s (1.33 s of it in
the kernel) without, 1.1-1.4 s (0.5 s) with.

Imports inside functions: the app, and what keeps the heap, once the early signal handlers are
in place (a signal during their imports then ends the process as described above).
"""

from __future__ import annotations

import os
import sys

from ..signals import install_early, pending_signal

__all__ = ["run"]


class _NoNumpyForArrow:
    """An import finder that says numpy is not installed to pyarrow's own modules as they start,
    and only to them: pyarrow (>= 16) works without numpy, and its extension modules
    (``pyarrow.lib``, ``pyarrow._compute``, ...) import numpy first thing when they find it
    (70-110 ms, numpy's BLAS and all, on every command; hframe hands pyarrow no numpy arrays).
    numpy stays importable by anything else (matplotlib for ``bench --plot``)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if (name == "numpy" or name.startswith("numpy.")) and _arrow_starting():
            raise ModuleNotFoundError(f"No module named {name!r} (hframe leaves numpy out of pyarrow)", name=name)
        return None


def _arrow_starting() -> bool:
    """Whether a pyarrow module is being imported now (its spec says so while it runs)."""
    return any(
        (key == "pyarrow" or key.startswith("pyarrow."))
        and getattr(getattr(m, "__spec__", None), "_initializing", False)
        for key, m in list(sys.modules.items())
    )


class _NoPandas:
    """An import finder that says pandas is not installed (this process never needs it)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (hframe leaves pandas out)", name=name)
        return None


def run() -> None:
    """Entry point of the ``hframe`` command (and ``python -m hframe_cli``)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before anything imports numpy: see above
    if "pandas" not in sys.modules:  # never imported for pyarrow's question: see above
        sys.meta_path.insert(0, _NoPandas())
    if "pyarrow" not in sys.modules:  # pyarrow without numpy: see above
        sys.meta_path.insert(0, _NoNumpyForArrow())
    install_early()
    try:
        from ..processes import keep_freed_heap, may_keep_freed_heap

        if may_keep_freed_heap():  # see above
            keep_freed_heap()
        from .app import run as cli_run

        if pending_signal() is not None:  # its exception was lost where it was raised
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        sys.stderr.write("hframe: error: interrupted while starting; nothing was done\n")
        sys.stderr.flush()
        os._exit(130)
    try:
        cli_run()
    except KeyboardInterrupt:  # one that came where main could not catch it (its first or last lines)
        sys.stderr.write("hframe: error: interrupted\n")
        sys.stderr.flush()
        os._exit(130)
