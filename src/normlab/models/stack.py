"""One stack builds every encoder: blocks from one placement plan, DeepNorm/Admin, the final norm.

:class:`Stack` asks :func:`normlab.models.placement.plan` for one
:class:`~normlab.models.placement.LayerSpec` per layer (every argument is
checked there, once), calls ``make_block(spec)`` for each, initialises the
block's matrices (DeepNorm's beta included), and adds the final norm where the
last layer is pre-style. The Transformer, Conformer and video encoders differ
only in their block and their input layers.

Blocks are called as modules, ``block(hidden, residual, mask) -> (hidden,
residual)`` (the carry of :mod:`normlab.nn.residual`), so every block's and
every norm's forward hooks fire, and the junction between two blocks, and the
final norm, are one fused add+norm wherever the norm takes ``residual``.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from .._checks import BadType, BadValue, check_count, check_padding_mask, check_rate, check_width, unknown_keywords
from ..nn.positional import PositionalEncoding
from ..nn.residual import Carry, add_norm, materialize
from .old_keys import foreign_old_keys, refuse_unconverted
from .placement import LayerSpec, init_block, plan


class Block(nn.Module):
    """A block of residual units for one layer: ``forward(hidden, residual=None, mask=None) -> (hidden, residual)``.

    The stream is ``hidden + residual`` (``residual`` None: ``hidden`` alone);
    ``materialize(*block(x))`` is the block's output stream as one tensor.
    """

    #: True when the block ends every pre-style layer with its own norm (the Conformer): no final norm then
    self_closing = False

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.spec = spec
        self.placement = spec.kind

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        raise NotImplementedError

    def check_carry(self, hidden, residual, width: int) -> None:
        """What an encoder checks of its input, for a block called by itself: ``hidden`` a floating tensor ending
        in ``width`` features, of the block's dtype, and ``residual`` None or a floating tensor. A post-style
        block reached torch's "mat1 and mat2 shapes cannot be multiplied", a float64 input "must have the same
        dtype", an integer residual was added as it was, a list one raised AttributeError."""
        check_width(hidden, width, "hidden")
        check_input_dtype(hidden, self, "block")
        if residual is not None and not (isinstance(residual, torch.Tensor)
                                         and (residual.dtype.is_floating_point or residual.dtype == torch.bool)):
            got = residual.dtype if isinstance(residual, torch.Tensor) else type(residual).__name__
            raise BadType(f"the residual (the pending stream) must be a floating-point tensor or None, got {got}")


class Stack(nn.Module):
    """``n_layers`` blocks from ``make_block(spec)``, initialised by ``init``, and the final norm.

    Args:
        n_layers: blocks. make_block: ``LayerSpec -> Block``.
        dim: feature size of the norms. norm, placement: registry names; norm_kw: extra norm arguments.
        init: ``"torch"`` or ``"xavier"`` (see :mod:`normlab.models.placement`).
        inputs: modules (or parameters) applied to the input by the encoder, registered before the
            blocks so that a seeded model draws its weights in that order.

    ``forward(x, mask=None)`` runs the blocks and the final norm (``final_norm``,
    None where the stack ends normalized).
    """

    def __init__(self, n_layers: int, make_block: Callable[[LayerSpec], nn.Module], *, dim: int,
                 norm: str = "layernorm", placement: str = "pre", init: str = "torch", norm_kw: dict | None = None,
                 inputs: dict[str, nn.Module | nn.Parameter | None] | None = None):
        super().__init__()
        self.register_load_state_dict_post_hook(Stack._refuse_unconverted)
        specs = plan(placement, n_layers, dim=dim, norm=norm, norm_kw=norm_kw, init=init)
        self.norm_name, self.placement_name = norm, placement
        for name, m in (inputs or {}).items():
            setattr(self, name, m)
        self.layers = nn.ModuleList()
        for spec in specs:
            block = make_block(spec)
            init_block(block, spec)
            self.layers.append(block)
        closes = specs[-1].slots.pre and not getattr(self.layers[-1], "self_closing", False)
        self.final_norm = specs[-1].make_norm() if closes else None

    def run_layers(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks, then the final norm, each given ``mask``."""
        check_padding_mask(mask, x)
        hidden, residual = x, None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, mask)
        if self.final_norm is None:
            return materialize(hidden, residual)
        return add_norm(hidden, residual, self.final_norm, mask)[0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.run_layers(x, mask)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # old keys are judged once the whole stack has loaded (_refuse_unconverted): a load pre-hook of the
        # user's on this module or any inside it, where torch runs it, may have converted them by then
        self._old_keys_seen = (prefix, foreign_old_keys(state_dict, self, prefix))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _refuse_unconverted(module: Stack, incompatible) -> None:
        """A load post-hook: after this stack and every module inside it loaded."""
        prefix, old = module.__dict__.pop("_old_keys_seen", ("", []))
        refuse_unconverted(old, incompatible.missing_keys, prefix)


class SequenceEncoder(Stack):
    """``[B, T, F]`` frames -> ``[B, T, D]``: optional input projection, positions, dropout, then the blocks.

    Subclasses name their block (``block``); the signature is shared, so any
    sequence encoder is built with one call.

    Args:
        d_model, n_heads, n_layers, d_ff: sizes (``d_ff`` defaults to ``4 * d_model``).
        norm, placement: names from :mod:`normlab.registry`; norm_kw: extra norm arguments (e.g. ``{"eps": 1e-12}``).
        dropout: inside the blocks and after the positional encoding. init: ``"torch"`` or ``"xavier"``.
        input_dim: if given, a linear map from ``input_dim`` features to ``d_model``.
        pos: ``"sinusoidal"``, ``"learned"`` or ``"none"``; max_len: longest sequence.
        **block_kw: forwarded to every block.

    Shape:
        ``x``: ``(B, T, input_dim or D)``; ``key_padding_mask``: bool ``(B, T)``,
        True = padding. Output ``(B, T, D)``.
    """

    block: type[Block]

    def __init__(self, d_model: int, n_heads: int, n_layers: int, d_ff: int | None = None, *,
                 norm: str = "layernorm", placement: str = "pre", dropout: float = 0.0, init: str = "torch",
                 norm_kw: dict | None = None, input_dim: int | None = None, pos: str = "sinusoidal",
                 max_len: int = 4096, **block_kw) -> None:
        check_sizes(d_model, n_heads, d_ff, dropout, block_kw.get("attn_dropout"))
        check_count(max_len, "max_len")
        own, unknown = unknown_keywords(self.block, block_kw, fixed=("self", "d_model", "n_heads", "d_ff", "dropout",
                                                                      "spec"))
        if unknown:  # (the block's TypeError)
            mine = inspect.signature(type(self).__init__).parameters  # the block arguments the encoder sets itself
            theirs = [k for k in own if k not in mine and k not in ("layer_index", "n_layers")]
            raise BadValue(f"{', '.join(map(repr, unknown))}: not an argument of {type(self).__name__} or its "
                           f"{self.block.__name__}; the block's own: {', '.join(theirs)}")
        if input_dim is not None:
            check_count(input_dim, "input_dim")
        inputs = {"input_proj": nn.Linear(input_dim, d_model) if input_dim else None,
                  "pos": PositionalEncoding(pos, d_model, max_len), "drop": nn.Dropout(dropout)}
        super().__init__(n_layers, lambda spec: self.block(d_model, n_heads, d_ff, dropout=dropout, spec=spec,
                                                           **block_kw),
                         dim=d_model, norm=norm, placement=placement, init=init, norm_kw=norm_kw, inputs=inputs)
        self.pos_dim = d_model  # the width of the blocks' input

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        width = self.input_proj.in_features if self.input_proj is not None else getattr(self, "pos_dim", None)
        check_width(x, width, "input", dims=3)
        check_input_dtype(x, self)
        if self.input_proj is not None:
            x = self.input_proj(x)  # B, T, D
        x = self.drop(self.pos(x))  # B, T, D
        return self.run_layers(x, key_padding_mask)  # B, T, D


def _autocasting(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # an older torch: no device argument
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def check_input_dtype(x: torch.Tensor, model: nn.Module, what: str = "encoder") -> None:
    """An encoder's input must be floating point and, outside autocast, of its parameters' dtype: one line naming
    both (a float64 input to a float32 model failed inside its first Linear, and an integer one with a norm's
    error or torch's, by placement)."""
    p = next(model.parameters(), None)
    if p is None or x.dtype == p.dtype:
        return
    if not x.dtype.is_floating_point:
        raise BadType(f"the input is {x.dtype}: the {what} needs floating-point input ({p.dtype}, as its "
                      "parameters)")
    if not _autocasting(x.device.type):  # under autocast the layers cast it
        raise BadType(f"the input is {x.dtype} but the {what}'s parameters are {p.dtype}: convert one to the "
                      f"other (model.to({p.dtype}) or x.to({p.dtype}))")


def check_sizes(d_model, n_heads, d_ff=None, dropout=0.0, attn_dropout=None) -> None:
    """A block's sizes and rates, each one clear ``BadValue`` (they failed deep inside torch, or a ``d_ff`` of 0
    was quietly read as the default)."""
    check_count(d_model, "d_model")
    check_count(n_heads, "n_heads")
    if d_ff is not None:
        check_count(d_ff, "d_ff")
    check_rate(dropout, "dropout")
    if attn_dropout is not None:
        check_rate(attn_dropout, "attn_dropout")


def compile_blocks(model: nn.Module, **compile_kw) -> nn.Module:
    """Opt-in: compile every block of every :class:`Stack` in ``model`` with ``torch.compile``; returns ``model``.

    Each block module is compiled in place (``nn.Module.compile``): its whole
    forward (norms, fused add+norms, attention and feed-forward, and any hooks)
    becomes one compiled graph, so inductor fuses the element-wise work between
    the GEMMs; the norms inside run normlab's fused math (see
    :mod:`normlab.kernels.dispatch`). Module names, ``state_dict`` and outputs
    are unchanged (within float rounding). The first call of each shape
    compiles (seconds to minutes); a compiled model cannot be pickled or
    deep-copied. Hooks on the modules inside a block must be added before its
    first call: torch.compile does not check for new ones (a hook on the block
    itself still fires). ``compile_kw`` goes to ``torch.compile`` (e.g.
    ``dynamic=False``).
    """
    for stack in [m for m in model.modules() if isinstance(m, Stack)]:
        for layer in stack.layers:
            if getattr(layer, "_compiled_call_impl", None) is None:
                layer.compile(**compile_kw)
    return model
