"""Weights to and from torch's TransformerEncoderLayer, and BERT checkpoints.

``from_torch(layer)`` / ``to_torch(block)`` map a
``torch.nn.TransformerEncoderLayer(batch_first=True)`` (``norm_first`` False:
Post-Norm, True: Pre-Norm) to a :class:`normlab.TransformerBlock` and back.
:func:`load_bert` lives in :mod:`normlab.models.bert` and is re-exported here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn

from ._checks import BadType, BadValue
from .models.bert import BertEncoder, load_bert
from .models.transformer import TransformerBlock

__all__ = ["from_torch", "to_torch", "load_bert", "BertEncoder"]


def _activation_name(layer: nn.TransformerEncoderLayer) -> str:
    act = layer.activation
    if act is TF.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is TF.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"  # exact (erf), as normlab's
    raise BadValue(f"unsupported activation {act!r}: only relu and gelu map to normlab")


@torch.no_grad()
def from_torch(layer: nn.TransformerEncoderLayer) -> TransformerBlock:
    """An equivalent :class:`TransformerBlock` (same weights, same outputs) for ``layer``."""
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise BadType(f"expected torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
    if not getattr(layer.self_attn, "batch_first", False):
        raise BadValue("only batch_first=True layers are supported ([B, T, D] throughout normlab)")
    for n in (layer.norm1, layer.norm2):  # a norm put in place of torch's, or one without its weight
        if type(n) is not nn.LayerNorm or not n.elementwise_affine or (n.bias is None) != (layer.norm1.bias is None):
            raise BadValue(f"only layers whose two norms are torch.nn.LayerNorm with a weight (and both with or both "
                           f"without a bias) map to normlab; this one has {n}")
    attn = layer.self_attn
    d = attn.embed_dim
    bias = attn.in_proj_bias is not None
    # what normlab's attention does not compute (each read as plain attention: outputs 0.05-0.18 off, silently),
    # and linear maps of which some have a bias and some not (a state dict missing its bias)
    extra = [name for name, there in (("add_bias_kv", attn.bias_k is not None), ("add_zero_attn", attn.add_zero_attn),
                                      ("kdim/vdim other than embed_dim", not attn._qkv_same_embed_dim)) if there]
    if extra:
        raise BadValue(f"unsupported self_attn: {', '.join(extra)} (normlab's attention has one projection of "
                       "queries, keys and values and nothing added to them)")
    biased = {name: m.bias is not None for name, m in (("out_proj", attn.out_proj), ("linear1", layer.linear1),
                                                        ("linear2", layer.linear2))}
    if any(b != bias for b in biased.values()):
        raise BadValue(f"the layer's linear maps must all have a bias or none; in_proj: {bias}, "
                       + ", ".join(f"{k}: {v}" for k, v in biased.items()))
    p = layer.linear1.weight
    block = TransformerBlock(
        d, attn.num_heads, layer.linear1.out_features, norm="layernorm",
        placement="pre" if layer.norm_first else "post", dropout=layer.dropout.p,
        activation=_activation_name(layer), bias=bias,
        norm_kw={"eps": layer.norm1.eps, "bias": layer.norm1.bias is not None},
    ).to(device=p.device, dtype=p.dtype)
    a = block.attn.fn
    a.qkv_proj.weight.copy_(attn.in_proj_weight)  # 3D, D: rows [q; k; v] in both layouts
    if bias:
        a.qkv_proj.bias.copy_(attn.in_proj_bias)  # 3D
    a.out_proj.load_state_dict(attn.out_proj.state_dict())
    block.ffn.fn.fc1.load_state_dict(layer.linear1.state_dict())
    block.ffn.fn.fc2.load_state_dict(layer.linear2.state_dict())
    slot = "pre_norm" if layer.norm_first else "post_norm"
    getattr(block.attn, slot).load_state_dict(layer.norm1.state_dict())
    getattr(block.ffn, slot).load_state_dict(layer.norm2.state_dict())
    getattr(block.ffn, slot).eps = layer.norm2.eps  # each norm its own eps (torch's constructor sets one for both)
    # each dropout its own rate, as torch's four modules hold them (the constructor's one rate may have been changed)
    block.attn.drop.p = layer.dropout1.p  # the attention branch's output
    a.dropout = attn.dropout  # the attention weights
    block.ffn.fn.drop.p = layer.dropout.p  # after the feed-forward's activation
    block.ffn.drop.p = layer.dropout2.p  # the feed-forward branch's output
    return block.train(layer.training)


@torch.no_grad()
def to_torch(block: TransformerBlock) -> nn.TransformerEncoderLayer:
    """The ``torch.nn.TransformerEncoderLayer(batch_first=True)`` equivalent to ``block``."""
    if not isinstance(block, TransformerBlock):
        raise BadType(f"expected a normlab TransformerBlock, got {type(block).__name__}")
    if block.placement not in ("pre", "post"):
        raise BadValue(f"torch has only pre and post placements, block uses {block.placement!r}")
    a, ffn = block.attn.fn, block.ffn.fn
    if ffn.activation not in ("relu", "gelu"):
        raise BadValue(f"torch's layer supports relu and gelu, block uses {ffn.activation!r}")
    slot = "pre_norm" if block.placement == "pre" else "post_norm"
    norm = getattr(block.attn, slot)
    for n in (norm, getattr(block.ffn, slot)):  # both slots: an RMSNorm in the second read as LayerNorm's bias
        if type(n).__name__ != "LayerNorm":
            raise BadValue(f"torch's layer uses LayerNorm, block uses {type(n).__name__}")
    biased = {"qkv_proj": a.qkv_proj.bias is not None, "out_proj": a.out_proj.bias is not None,
              "fc1": ffn.fc1.bias is not None, "fc2": ffn.fc2.bias is not None}
    if len(set(biased.values())) > 1:
        raise BadValue("torch's layer has a bias on all its linear maps or on none; block: "
                       + ", ".join(f"{k}: {v}" for k, v in biased.items()))
    if a.causal:
        raise BadValue("block is causal and torch's layer is not by itself (it takes is_causal=True and a mask at "
                       "each call): not converted")
    if len({a.dropout, ffn.drop.p, block.attn.drop.p, block.ffn.drop.p}) > 1:
        raise BadValue(f"torch's layer has one dropout; block uses {block.attn.drop.p} on its attention branch, "
                       f"{block.ffn.drop.p} on its feed-forward branch, {a.dropout} on the attention weights and "
                       f"{ffn.drop.p} after the feed-forward's activation")
    linear_bias = a.qkv_proj.bias is not None
    for n in (norm, getattr(block.ffn, slot)):
        if n.weight is None or (n.bias is not None) != linear_bias:
            raise BadValue(f"torch's layer norms have a weight, and a bias where its linear maps have one "
                           f"(bias={linear_bias}); block's norm: {n}")
    w = a.qkv_proj.weight
    layer = nn.TransformerEncoderLayer(
        a.d_model, a.n_heads, ffn.fc1.out_features, dropout=block.attn.drop.p, activation=ffn.activation,
        layer_norm_eps=norm.eps, batch_first=True, norm_first=block.placement == "pre",
        bias=a.qkv_proj.bias is not None, device=w.device, dtype=w.dtype,
    )
    layer.self_attn.in_proj_weight.copy_(w)  # 3D, D
    if a.qkv_proj.bias is not None:
        layer.self_attn.in_proj_bias.copy_(a.qkv_proj.bias)  # 3D
    layer.self_attn.out_proj.load_state_dict(a.out_proj.state_dict())
    layer.linear1.load_state_dict(ffn.fc1.state_dict())
    layer.linear2.load_state_dict(ffn.fc2.state_dict())
    layer.norm1.load_state_dict(norm.state_dict())
    layer.norm2.load_state_dict(getattr(block.ffn, slot).state_dict())
    layer.norm2.eps = getattr(block.ffn, slot).eps  # the constructor gave both norms the first one's
    return layer.train(block.training)
