"""``hframe_cli.sampler``, as the README has long shown it: the names of ``hframe_cli.training.sampler``."""

from .training.sampler import *  # noqa: F403
from .training.sampler import __all__ as __all__
