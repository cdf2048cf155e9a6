"""The hframe exception hierarchy and the exit code each error maps to.

Our exception hierarchy::

    HframeError                      exit 4 (internal) unless a subclass says otherwise
    ├── InputError                   exit 2: bad source, bad flag value, output exists
    │   └── NotFound                 a frame id or name that the pack does not hold
    ├── FormatError                  exit 1: the bytes are not a valid frame pack / index
    │   ├── DictionaryUnavailable    a frame needs the pack's zstd dictionary, which it lacks
    │   ├── NotAPack                 wrong magic at offset 0
    │   ├── UnsupportedVersion       a major version this release cannot read
    │   ├── IncompletePack           no valid trailer: truncated or still being written
    │   └── IndexMismatch            the index belongs to another pack (UUID / size / count)
    ├── IntegrityError               exit 1: stored bytes disagree with what was recorded
    │   ├── ChecksumMismatch         md5 of the bytes read differs from the index
    │   ├── MagicMismatch            magic bytes disagree with the recorded media type
    │   └── FrameOutOfRange          offset + length lies beyond the end of the pack
    ├── StorageError                 exit 3: I/O failed (disk full, unreachable, permission)
    │   ├── PackReplaced             a reader's pack was replaced and its version is out of reach
    │   └── OutOfMemory              a frame needs more memory than the process may take
    ├── PackLocked                   exit 3: another run holds the output
    ├── NothingToResume              exit 5: resume found no partial pack, checkpoint or pack
    └── Interrupted                  exit 130: SIGINT/SIGTERM; a checkpoint was written

The CLI maps every ``HframeError`` to its ``exit_code`` in one place (``cli.app.main``).

No message holds a password: a URL's ``user:password@`` is shown as ``user:***@`` in every
``HframeError`` (``locations.redact``), whoever builds it and whatever location it names, so
neither an error line, a ``--json`` document nor a traceback or a caller's log can show it.
"""

from __future__ import annotations

from .locations import redact

__all__ = [
    "EXIT_DATA",
    "EXIT_ENV",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_NOTHING_TO_RESUME",
    "EXIT_OK",
    "EXIT_USAGE",
    "ChecksumMismatch",
    "FormatError",
    "FrameOutOfRange",
    "HframeError",
    "DictionaryUnavailable",
    "IncompletePack",
    "IndexMismatch",
    "InputError",
    "Interrupted",
    "IntegrityError",
    "MagicMismatch",
    "NotAPack",
    "NotFound",
    "NothingToResume",
    "OutOfMemory",
    "PackLocked",
    "PackReplaced",
    "StorageError",
    "UnsupportedVersion",
]

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_ENV = 3
EXIT_INTERNAL = 4
EXIT_NOTHING_TO_RESUME = 5
EXIT_INTERRUPTED = 130


class HframeError(Exception):
    """Base class of every error hframe raises on purpose."""

    exit_code = EXIT_INTERNAL

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class InputError(HframeError):
    """A source, option or argument that hframe cannot accept."""

    exit_code = EXIT_USAGE


class NotFound(InputError):
    """A frame id or name that the pack does not hold."""


class FormatError(HframeError):
    """Bytes that do not form a valid frame pack or index."""

    exit_code = EXIT_DATA


class NotAPack(FormatError):
    """The file does not start with the frame-pack magic."""


class UnsupportedVersion(FormatError):
    """The pack or index uses a major version this release cannot read."""


class DictionaryUnavailable(FormatError):
    """A frame was compressed with the pack's zstd dictionary, and the pack has none to give."""


class IncompletePack(FormatError):
    """The pack has no valid trailer: it is truncated or still being written."""


class IndexMismatch(FormatError):
    """The index does not describe this pack (UUID, size or frame count differ)."""


class IntegrityError(HframeError):
    """Stored bytes disagree with what was recorded when they were packed."""

    exit_code = EXIT_DATA


class ChecksumMismatch(IntegrityError):
    """The md5 of a frame's bytes differs from the recorded md5."""


class MagicMismatch(IntegrityError):
    """A frame's first bytes do not match its recorded media type."""


class FrameOutOfRange(IntegrityError):
    """A frame's offset + length lies beyond the end of the pack."""


class StorageError(HframeError):
    """Reading or writing storage failed (disk full, unreachable, permission)."""

    exit_code = EXIT_ENV


class PackReplaced(StorageError):
    """The pack a reader opened was replaced (republished), and that version can no longer be reached."""


class OutOfMemory(StorageError):
    """The machine could not give a frame's bytes the memory they need (exit 3, like storage:
    the data may be fine; run where more memory is allowed)."""


class PackLocked(HframeError):
    """Another run is writing the same output."""

    exit_code = EXIT_ENV


class NothingToResume(HframeError):
    """``resume`` found nothing of the pack on disk."""

    exit_code = EXIT_NOTHING_TO_RESUME


class Interrupted(HframeError):
    """Stopped by SIGINT/SIGTERM at a safe point; the checkpoint is kept."""

    exit_code = EXIT_INTERRUPTED
