"""normlab: layer normalization for Transformers, from first principles.

>>> import torch, normlab
>>> ln = normlab.LayerNorm(768)
>>> y = ln(torch.randn(2, 100, 768))        # [B, T, D]: each frame normalized alone

Names are imported on first use, so ``normlab --help`` and ``import normlab``
do not pay for importing torch.
"""
from __future__ import annotations

import importlib
import os

__version__ = "0.2.0"

#: ``[this process, the process that started it]``, read when normlab is first imported (before torch): a rank or
#: a worker asks to end with its parent (``workers.die_with_parent``) seconds later, and a parent that had died
#: meanwhile went unnoticed (the orphan kept training). A forked child reads its own.
_ORIGIN = [os.getpid(), os.getppid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _ORIGIN.__setitem__(slice(None), [os.getpid(), os.getppid()]))

#: public name -> module that defines it
_EXPORTS = {
    "LayerNorm": "norms", "RMSNorm": "norms", "ScaleNorm": "norms", "DyT": "norms",
    "make_norm": "registry", "NORMS": "registry", "PLACEMENTS": "registry",
    "TransformerBlock": "models.transformer", "TransformerEncoder": "models.transformer",
    "ConformerBlock": "models.conformer", "ConformerEncoder": "models.conformer", "VideoEncoder": "models.video",
    "UserError": "_checks",
}
_SUBMODULES = ("functional", "kernels", "reference", "nn", "models", "lab", "studies", "diarization", "interop")

__all__ = [*_EXPORTS, "functional", "kernels", "reference", "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'normlab' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})  # a name already imported is in globals() too
