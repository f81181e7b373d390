"""Deprecated: the residual unit moved to :mod:`normlab.nn.residual` and the placement rules to
:mod:`normlab.models.placement` (this path is removed in normlab 0.3)."""
from ._compat import forward_module

forward_module(__name__, "normlab.models.placement")
from .nn.residual import ResidualUnit as Residual  # noqa: E402  the old name of the unit
from .nn.residual import add_norm, apply_norm  # noqa: E402,F401
