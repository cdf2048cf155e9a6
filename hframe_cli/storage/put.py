"""One object written to a store by a child process that completes the upload only after its
last byte (``put_objects``), and objects deleted (``delete_object``).

Why a child: an S3 multipart upload becomes visible when it is completed, and pyarrow completes
it when its stream is closed for any reason, an exception included, so a write cut short in
this process (Ctrl-C, an error) would publish a cut object at the final key. The child ignores
the terminal's signals, completes each object only once every byte is sent, and on any failure,
or when its parent is gone (``PR_SET_PDEATHSIG`` and a watchdog), ends at once with
``os._exit``: what it was writing stays an incomplete multipart upload, which no reader sees (an
S3 lifecycle rule, AbortIncompleteMultipartUpload, reclaims its parts). The parent retries a
failed child under the request policy's attempts and backoff, from the first object not done.

    python -m hframe_cli.storage.put FILE LOCATION [FILE LOCATION...]   # the child
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ..errors import HframeError, InputError, StorageError
from ..faults import fault_point
from ..locations import is_remote, shown_url
from ..processes import die_with_parent
from .objectstore import object_at
from .policy import RequestPolicy

__all__ = ["copy_object", "delete_object", "put_objects"]

_CHUNK = 8 << 20


def _store(url: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path) of an object-store location."""

    return object_at(url, RequestPolicy.from_env())


def copy_object(source: str, target: str) -> None:
    """Copy an object to another key of the same store, inside the store (S3 CopyObject: the
    target appears whole, in one step for readers)."""
    fs, key = _store(source)
    try:
        fs.copy_file(key, _store(target)[1])
    except OSError as e:
        raise StorageError(f"{shown_url(target)}: cannot copy {shown_url(source)} there: {_short(e)}") from None


def _short(e: BaseException) -> str:
    return str(e).split("Detail:")[0].strip() or type(e).__name__


def delete_object(url: str) -> None:
    """Delete an object; one that is not there is fine."""
    fs, key = _store(url)
    try:
        fs.delete_file(key)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageError(f"{shown_url(url)}: cannot delete: {_short(e)}") from None


def put_objects(files: list[tuple[str, str]]) -> None:
    """Upload each (file, location), in order, through one child process (see the module
    docstring), with the request policy's attempts and backoff: a failed attempt goes on from
    the first object not yet complete. Stopped (a signal, an exception), the child is killed and
    the object it was writing never appears."""

    policy = RequestPolicy.from_env()
    started = time.monotonic()
    done = 0
    for attempt in range(1, policy.attempts + 1):
        proc = subprocess.Popen(
            [sys.executable, "-m", "hframe_cli.storage.put", *(x for pair in files[done:] for x in pair)],
            env={**os.environ, "HFRAME_UPLOAD_PARENT": str(os.getpid())},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the terminal reaches this process, not the child
        )
        try:
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        done += (proc.stdout.read() if proc.stdout else b"").count(b"\n")  # a line per object completed
        err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
        if proc.returncode == 0 and done == len(files):
            return
        if proc.returncode == 2 or attempt == policy.attempts:
            why = err.splitlines()[-1] if err else f"exit {proc.returncode}"
            raise StorageError(
                f"{shown_url(files[min(done, len(files) - 1)][1])}: upload failed after {attempt} "
                f"attempt{'s' if attempt > 1 else ''} in {time.monotonic() - started:.1f} s: {why}"
            )
        time.sleep(random.uniform(0, min(policy.backoff_cap_s, policy.backoff_s * 2 ** (attempt - 1))))


def _die_with_parent(parent: int) -> None:
    """End this process (no upload completed) as soon as ``parent`` is gone: a writer killed
    (SIGKILL, a hang-up) must not leave an upload running that could land over a later publish."""
    die_with_parent(parent)

    def watch() -> None:  # elsewhere (and should the parent have died before prctl)
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _child(files: list[tuple[str, str]]) -> int:
    """The child's work: for each object, send every byte, and only then complete its upload
    (a line on stdout says so). Any failure ends the process at once (``os._exit``), before
    pyarrow could complete a cut upload; so does the end of the parent."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent(int(os.environ.get("HFRAME_UPLOAD_PARENT", os.getppid())))
    try:
        for path, url in files:
            fs, key = _store(url)
            size = os.path.getsize(path)
            stream = fs.open_output_stream(key)
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    stream.write(chunk)
                    sent += len(chunk)
            if sent != size:
                raise OSError(f"{path} changed while it was uploaded ({sent} of {size} bytes)")
            fault_point("upload-before-complete")
            stream.close()  # completes the upload: the object appears, whole
            sys.stdout.write(f"{url}\n")
            sys.stdout.flush()
            fault_point("upload-after-object")
    except HframeError as e:
        sys.stderr.write(f"{e}\n")
        sys.stderr.flush()
        os._exit(2 if isinstance(e, InputError) else 3)
    except BaseException as e:  # noqa: BLE001 - whatever it is, the upload must not complete
        sys.stderr.write(f"{_short(e)}\n")
        sys.stderr.flush()
        os._exit(3)
    return 0


if __name__ == "__main__":  # the child: python -m hframe_cli.storage.put FILE URL [FILE URL...]
    _args = sys.argv[1:]
    if not _args or len(_args) % 2 or not all(is_remote(u) for u in _args[1::2]):
        sys.stderr.write("usage: python -m hframe_cli.storage.put FILE URL [FILE URL...]\n")
        sys.exit(2)
    sys.exit(_child(list(zip(_args[0::2], _args[1::2]))))
