"""treeflash: lossless speculative decoding on one GPU, in PyTorch + Triton."""

__version__ = "0.1.0"
