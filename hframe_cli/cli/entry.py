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

pandas: pyarrow imports it (about 0.3 s, and pyarrow.compute with it) the first time it makes an
array or table from Python values, only to ask whether they are a DataFrame. hframe uses no
pandas, so the command's process finds none (``_NoPandas``) unless something imported it
already; a library caller's process is left as it is.

Imports inside functions: the app, once the early signal handlers are in place (a signal during
its imports then ends the process as described above).
"""

from __future__ import annotations

import os
import sys

from ..signals import install_early, pending_signal

__all__ = ["run"]


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
    install_early()
    try:
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
