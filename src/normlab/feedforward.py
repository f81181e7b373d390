"""Deprecated: moved to :mod:`normlab.nn.feedforward` (this path is removed in normlab 0.3)."""
from ._compat import forward_module

forward_module(__name__, "normlab.nn.feedforward")
