"""PyTorch: the map-style FrameDataset and the BlockShuffleSampler."""
