"""Multi-head self-attention on ``F.scaled_dot_product_attention``, with one fused QKV projection.

The query, key and value maps are one ``qkv_proj`` Linear of ``3 * D`` outputs
(one GEMM), laid out like torch's ``in_proj_weight``: rows ``[0, D)`` are the
query map, ``[D, 2D)`` the key map, ``[2D, 3D)`` the value map. ``q_proj``,
``k_proj`` and ``v_proj`` remain as views of those rows (for inspection and
init). A file written with separate ``q_proj``/``k_proj``/``v_proj`` weights
is refused with the converter's name (:mod:`normlab.models.old_keys`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF
from torch import nn

from .._checks import BadType, BadValue, check_flag, check_padding_mask


def attention_mask(key_padding_mask: torch.Tensor | None, t: int, causal: bool, device) -> torch.Tensor | None:
    """Boolean mask for SDPA, True = may attend; None when nothing is masked.

    ``key_padding_mask`` is bool ``[B, T]`` with True marking padding (torch's
    convention). Without ``causal`` the mask is ``[B, 1, 1, T]`` (one row per
    sequence, broadcast over heads and queries: no ``T x T`` tensor is built);
    with ``causal`` it is ``[B or 1, 1, T, T]``. A query row with no allowed key
    (a fully padded sequence) is let attend everywhere, so it yields a finite
    (ignored) value, not NaN.
    """
    if key_padding_mask is None and not causal:
        return None
    if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
        raise BadType(f"key_padding_mask must be bool (True = padding), got {key_padding_mask.dtype}")
    if not causal:
        allowed = ~key_padding_mask[:, None, None, :]  # B, 1, 1, T
        return allowed | ~allowed.any(-1, keepdim=True)
    allowed = torch.ones(1, 1, t, t, dtype=torch.bool, device=device).tril()  # 1, 1, T, T
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # B, 1, T, T
    return allowed | ~allowed.any(-1, keepdim=True)


class QKVLinear(nn.Linear):
    """``Linear(D, 3D)`` whose init draws the q, k and v blocks as three ``Linear(D, D)`` would, in that order.

    Each ``D x D`` block (and its bias) gets torch's Linear init from its own
    fan-in and fan-out, consuming the random stream exactly as three separate
    Linear layers did, so a seeded model starts from the same weights.
    """

    def reset_parameters(self) -> None:
        d = self.in_features
        for i in range(3):
            w = self.weight[i * d:(i + 1) * d]  # D, D
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            if self.bias is not None:
                bound = 1 / math.sqrt(d) if d > 0 else 0
                nn.init.uniform_(self.bias[i * d:(i + 1) * d], -bound, bound)


class ProjView:
    """One of the q/k/v blocks of a :class:`QKVLinear`, shaped like a ``Linear(D, D)``.

    ``weight`` and ``bias`` are detached views of the fused parameters: writing
    to them (init, ``zero_()``) writes the fused projection; they carry no
    gradient (take the fused parameter's ``.grad`` rows for that).
    """

    def __init__(self, fused: QKVLinear, index: int):
        self.fused, self.index = fused, index
        self.in_features = self.out_features = fused.in_features

    def _rows(self, t: torch.Tensor | None) -> torch.Tensor | None:
        d = self.in_features
        return None if t is None else t.detach()[self.index * d:(self.index + 1) * d]

    @property
    def weight(self) -> torch.Tensor:
        return self._rows(self.fused.weight)  # D, D

    @property
    def bias(self) -> torch.Tensor | None:
        return self._rows(self.fused.bias)  # D

    def __repr__(self) -> str:
        return f"ProjView({'qkv'[self.index]}, {self.in_features}x{self.out_features})"


class MultiHeadSelfAttention(nn.Module):
    """``out_proj(softmax(Q K^T / sqrt(d_head)) V)`` over ``n_heads`` heads.

    Args:
        d_model: feature size ``D``; n_heads: heads (``D % n_heads == 0``).
        dropout: attention-probability dropout (training only; 0 skips the random mask).
        bias: biases on the projections. causal: mask future positions.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise BadValue(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        check_flag(bias, "bias")
        check_flag(causal, "causal")  # ("no" ran causal attention)
        self.d_model, self.n_heads, self.dropout, self.causal = d_model, n_heads, dropout, causal
        self.qkv_proj = QKVLinear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    q_proj = property(lambda self: ProjView(self.qkv_proj, 0))
    k_proj = property(lambda self: ProjView(self.qkv_proj, 1))
    v_proj = property(lambda self: ProjView(self.qkv_proj, 2))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 3:  # a block called on its own: one line, not an unpacking error
            raise BadValue(f"attention needs an input of shape (B, T, {self.d_model}), got {list(x.shape)}")
        # (B, T) exactly: a (1, T) mask broadcast silently over the batch; other shapes failed inside torch
        check_padding_mask(key_padding_mask, x)
        b, t, d = x.shape  # B, T, D
        h = self.n_heads
        # split, not select or unbind: the three gradients then meet in one cat, with no zero-filled 3D buffers
        q, k, v = (p.view(b, t, h, d // h).transpose(1, 2) for p in self.qkv_proj(x).split(d, -1))  # B, H, T, D/H
        mask = attention_mask(key_padding_mask, t, self.causal, x.device)  # B, 1, 1|T, T
        p = self.dropout if self.training else 0.0
        o = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # B, H, T, D/H
        return self.out_proj(o.transpose(1, 2).reshape(b, t, d))  # B, T, D

    def init_groups(self) -> tuple[list, list]:
        """``(query/key maps, value/output maps)``: DeepNorm scales the init of the second group."""
        return [self.q_proj, self.k_proj], [self.v_proj, self.out_proj]
