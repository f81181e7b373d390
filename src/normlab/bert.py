"""Deprecated: moved to :mod:`normlab.models.bert` (this path is removed in normlab 0.3)."""
from ._compat import forward_module

forward_module(__name__, "normlab.models.bert")
