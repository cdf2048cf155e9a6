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

Imports inside functions: the app, once the early signal handlers are in place (a signal during
its imports then ends the process as described above).
"""

from __future__ import annotations

import os
import sys

from ..signals import install_early, pending_signal

__all__ = ["run"]


def run() -> None:
    """Entry point of the ``hframe`` command (and ``python -m hframe_cli``)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before anything imports numpy: see above
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
