"""perfrun: profile unmodified PyTorch training scripts."""

__version__ = "0.1.0"
