"""Old module paths, kept for one release: each forwards to its new home with a DeprecationWarning."""
from __future__ import annotations

import importlib
import sys
import warnings


def forward_module(old: str, new: str) -> None:
    """Make module ``old`` expose every name of module ``new`` (private ones included), and warn once."""
    warnings.warn(f"{old} is deprecated and will be removed in normlab 0.3; import {new} instead",
                  DeprecationWarning, stacklevel=3)
    target = importlib.import_module(new)
    namespace = sys.modules[old].__dict__
    namespace.update({k: v for k, v in target.__dict__.items() if not k.startswith("__")})
    namespace["__all__"] = getattr(target, "__all__", [k for k in target.__dict__ if not k.startswith("_")])
