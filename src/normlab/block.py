"""TransformerBlock: attention and feed-forward residual units with one placement."""
from __future__ import annotations

import torch
from torch import nn

from .attention import MultiHeadSelfAttention
from .feedforward import FeedForward
from .placement import Residual, deepnorm_beta, layer_placement, slots

INITS = ("torch", "xavier")


def init_linear(m: nn.Linear, gain: float, scheme: str) -> None:
    """``xavier``: Xavier-normal weights times ``gain`` and zero biases; ``torch``: torch's init times ``gain``."""
    if scheme == "xavier":
        nn.init.xavier_normal_(m.weight, gain=gain)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif gain != 1.0:
        with torch.no_grad():
            m.weight.mul_(gain)


class TransformerBlock(nn.Module):
    """One encoder layer: ``attn`` unit then ``ffn`` unit, norms placed by ``placement``.

    Args:
        d_model: ``D``. n_heads: attention heads. d_ff: FFN hidden size (default ``4 * D``).
        norm: a name in :data:`normlab.registry.NORMS`. placement: a name in
            :data:`normlab.registry.PLACEMENTS`.
        dropout: on attention probabilities, FFN hidden and each branch output.
        attn_dropout: on attention probabilities only, if given (default: ``dropout``);
            0 keeps the fused attention kernel and skips a ``(B, H, T, T)`` random mask.
        activation: FFN activation (``gelu``, ``relu``, ``swish``, ``swiglu``).
        causal: mask future positions. bias: biases in the linear maps.
        layer_index, n_layers: where this block sits (mixln, deepnorm and admin need them).
        init: ``"torch"`` (torch's defaults) or ``"xavier"`` (Xavier-normal, zero biases).
        norm_kw: extra arguments for the norms (e.g. ``{"eps": 1e-12}``).

    Shape:
        ``x``: ``(B, T, D)``; ``key_padding_mask``: bool ``(B, T)``, True = padding.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        *,
        norm: str = "layernorm",
        placement: str = "pre",
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        activation: str = "gelu",
        causal: bool = False,
        bias: bool = True,
        layer_index: int = 0,
        n_layers: int = 1,
        init: str = "torch",
        norm_kw: dict | None = None,
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; valid: {', '.join(INITS)}")
        self.placement = layer_placement(placement, layer_index, n_layers)
        s = slots(placement, layer_index, n_layers)
        attn = MultiHeadSelfAttention(d_model, n_heads, dropout if attn_dropout is None else attn_dropout, bias=bias,
                                      causal=causal)
        ffn = FeedForward(d_model, d_ff or 4 * d_model, activation, dropout, bias=bias)
        self.attn = Residual(attn, d_model, norm, s, norm_kw=norm_kw)
        self.ffn = Residual(ffn, d_model, norm, s, norm_kw=norm_kw)
        self.drop = nn.Dropout(dropout)
        beta = deepnorm_beta(n_layers) if placement == "deepnorm" else 1.0
        for m in (attn.q_proj, attn.k_proj):
            init_linear(m, 1.0, init)
        for m in (attn.v_proj, attn.out_proj, *ffn.matrices()):
            init_linear(m, beta, init)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = key_padding_mask
        f = self.drop(self.attn.branch(x, mask))  # B, T, D
        if self.attn.slots.pre:  # x + f feeds the FFN's pre-norm: one fused add+norm
            h, h_normed = self.attn.combine_then_norm(x, f, self.ffn.norm, mask)  # B, T, D (x2)
            f = self.drop(self.ffn.branch(h, mask, normed=h_normed))
        else:
            h = self.attn.combine(x, f, mask)  # B, T, D
            f = self.drop(self.ffn.branch(h, mask))
        return self.ffn.combine(h, f, mask)  # B, T, D
