"""normlab: layer normalization for Transformers, from first principles.

>>> import torch, normlab
>>> ln = normlab.LayerNorm(768)
>>> y = ln(torch.randn(2, 100, 768))        # [B, T, D]: each frame normalized alone
"""
from . import functional, kernels, reference
from .block import TransformerBlock
from .conformer import ConformerBlock, ConformerEncoder
from .encoder import TransformerEncoder
from .norms import DyT, LayerNorm, RMSNorm, ScaleNorm
from .registry import NORMS, PLACEMENTS, make_norm
from .video import VideoEncoder

__version__ = "0.1.0"

__all__ = [
    "LayerNorm", "RMSNorm", "ScaleNorm", "DyT", "make_norm", "NORMS", "PLACEMENTS",
    "TransformerBlock", "TransformerEncoder", "ConformerBlock", "ConformerEncoder", "VideoEncoder",
    "functional", "kernels", "reference", "__version__",
]
