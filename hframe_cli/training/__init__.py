"""PyTorch: the map-style ``FrameDataset`` and the ``BlockShuffleSampler``. torch is optional:
``FrameDataset`` derives from ``torch.utils.data.Dataset`` where torch is installed (importing
this room imports it then), and ``import hframe_cli`` never imports this room."""

from .dataset import FrameDataset
from .sampler import BlockShuffleSampler

__all__ = ["BlockShuffleSampler", "FrameDataset"]
