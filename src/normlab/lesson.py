"""Deprecated: moved to :mod:`normlab.lab.lesson` (this path is removed in normlab 0.3)."""
from ._compat import forward_module

forward_module(__name__, "normlab.lab.lesson")
