"""normlab: layer normalization for Transformers, from first principles.

>>> import torch, normlab
>>> ln = normlab.LayerNorm(768)
>>> y = ln(torch.randn(2, 100, 768))        # [B, T, D]: each frame normalized alone
"""
from . import functional, kernels, reference
from .norms import DyT, LayerNorm, RMSNorm, ScaleNorm

__version__ = "0.1.0"

__all__ = ["LayerNorm", "RMSNorm", "ScaleNorm", "DyT", "functional", "kernels", "reference", "__version__"]
