"""Multi-head self-attention on ``F.scaled_dot_product_attention``."""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn


def attention_mask(key_padding_mask: torch.Tensor | None, t: int, causal: bool, device) -> torch.Tensor | None:
    """Boolean ``[B or 1, 1, T, T]`` mask, True = may attend; None when nothing is masked.

    ``key_padding_mask`` is bool ``[B, T]`` with True marking padding (torch's
    convention). A query row with no allowed key (a fully padded sequence) is
    let attend everywhere, so it yields a finite (ignored) value, not NaN.
    """
    if key_padding_mask is None and not causal:
        return None
    allowed = torch.ones(1, 1, t, t, dtype=torch.bool, device=device)  # 1, 1, T, T
    if causal:
        allowed = allowed.tril()
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be bool (True = padding), got {key_padding_mask.dtype}")
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # B, 1, T, T
    return allowed | ~allowed.any(-1, keepdim=True)


class MultiHeadSelfAttention(nn.Module):
    """``out_proj(softmax(Q K^T / sqrt(d_head)) V)`` over ``n_heads`` heads.

    Args:
        d_model: feature size ``D``; n_heads: heads (``D % n_heads == 0``).
        dropout: attention-probability dropout (training only).
        bias: biases on the four projections. causal: mask future positions.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.d_model, self.n_heads, self.dropout, self.causal = d_model, n_heads, dropout, causal
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape  # B, T, D
        h = self.n_heads

        def heads(p: nn.Linear) -> torch.Tensor:
            return p(x).view(b, t, h, d // h).transpose(1, 2)  # B, H, T, D/H

        mask = attention_mask(key_padding_mask, t, self.causal, x.device)  # B|1, 1, T, T
        o = TF.scaled_dot_product_attention(
            heads(self.q_proj), heads(self.k_proj), heads(self.v_proj),
            attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
        )  # B, H, T, D/H
        return self.out_proj(o.transpose(1, 2).reshape(b, t, d))  # B, T, D

    def init_groups(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """``(query/key maps, value/output maps)``: DeepNorm scales the init of the second group."""
        return [self.q_proj, self.k_proj], [self.v_proj, self.out_proj]
