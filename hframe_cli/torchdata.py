"""``hframe_cli.torchdata``, as the README has long shown it: the names of ``hframe_cli.training.dataset``."""

from .training.dataset import *  # noqa: F403
from .training.dataset import __all__ as __all__
