"""Parameter and FLOP counts of the norms in a model (``normlab count``).

FLOPs per token, forward. Norms follow lesson 003's count, where a
multiply-add is one operation: LayerNorm = mean (d) + centre (d) + variance
(d multiply-adds) + scale by rstd (d) + gamma/beta (d multiply-adds) = 5d;
RMSNorm 3d (no mean, no centring, no beta); ScaleNorm 2d; DyT 3d. Matrix
products count a multiply-add as two (the usual convention): attention
``8 d^2 + 4 T d`` (Q, K, V, output projections, scores, weighted sum over
``T`` keys), feed-forward ``4 d d_ff`` (``6 d d_ff`` for SwiGLU).
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch import nn

from .._checks import check_choice, check_count
from ..batchnorm import MaskedBatchNorm
from ..norms import DyT, LayerNorm, RMSNorm, ScaleNorm

NORM_TYPES = (LayerNorm, RMSNorm, ScaleNorm, DyT, MaskedBatchNorm, nn.LayerNorm, nn.RMSNorm,
              nn.modules.batchnorm._BatchNorm, nn.GroupNorm)

#: operations per token per feature, multiply-add counted once (lesson 003's convention)
NORM_OPS_PER_FEATURE = {"layernorm": 5, "rmsnorm": 3, "scalenorm": 2, "dyt": 3, "batchnorm": 2, "none": 0}

PRESETS = {
    "bert-base": dict(vocab_size=30522, hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                      intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
                      layer_norm_eps=1e-12, hidden_act="gelu", seq_len=512),
    "bert-large": dict(vocab_size=30522, hidden_size=1024, num_attention_heads=16, num_hidden_layers=24,
                       intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2,
                       layer_norm_eps=1e-12, hidden_act="gelu", seq_len=512),
}

_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def norm_parameters(model: nn.Module) -> dict:
    """Norm parameters per layer (``layers.<i>.`` in the module name) and outside layers."""
    per_layer: dict[int, int] = defaultdict(int)
    names: dict[int, list[str]] = defaultdict(list)
    outside, outside_names = 0, []
    for name, mod in model.named_modules():
        if not isinstance(mod, NORM_TYPES):
            continue
        n = sum(p.numel() for p in mod.parameters(recurse=False))
        m = _LAYER.search(name + ".")
        if m:
            per_layer[int(m.group(1))] += n
            names[int(m.group(1))].append(name)
        else:
            outside += n
            outside_names.append(name)
    in_layers = sum(per_layer.values())
    total = sum(p.numel() for p in model.parameters())
    return {
        "per_layer": [{"layer": i, "params": per_layer[i], "norms": names[i]} for i in sorted(per_layer)],
        "in_layers": in_layers,
        "outside_layers": outside,
        "outside_names": outside_names,
        "total_norm": in_layers + outside,
        "total_model": total,
        "share": (in_layers + outside) / total if total else 0.0,
    }


def flops_per_token(d_model: int, d_ff: int, seq_len: int, norm: str = "layernorm", norms_per_layer: int = 2,
                    swiglu: bool = False) -> dict:
    """Forward FLOPs per token per layer: each norm, all norms, attention, feed-forward."""
    check_choice(norm, NORM_OPS_PER_FEATURE, "norm")  # (a KeyError; negative sizes gave negative FLOPs)
    for value, name in ((d_model, "d_model"), (d_ff, "d_ff"), (seq_len, "seq_len")):
        check_count(value, name)
    check_count(norms_per_layer, "norms_per_layer", least=0)
    per_norm = NORM_OPS_PER_FEATURE[norm] * d_model
    attn = 8 * d_model**2 + 4 * seq_len * d_model
    ffn = (6 if swiglu else 4) * d_model * d_ff
    norms = norms_per_layer * per_norm
    return {"per_norm": per_norm, "norms": norms, "attention": attn, "ffn": ffn,
            "norm_share": norms / (norms + attn + ffn)}


def count_preset(name: str) -> dict:
    """Counts for a named BERT preset, built on the meta device (no memory)."""
    from ..models.bert import BertEncoder

    check_choice(name, PRESETS, "preset")
    cfg = dict(PRESETS[name])
    seq_len = cfg.pop("seq_len")
    with torch.device("meta"):
        model = BertEncoder(cfg)
    params = norm_parameters(model)
    flops = flops_per_token(cfg["hidden_size"], cfg["intermediate_size"], seq_len)
    return {"preset": name, "config": cfg, "seq_len": seq_len, "params": params, "flops": flops,
            "n_layers": cfg["num_hidden_layers"]}


def format_count(r: dict) -> str:
    p, f, L, T = r["params"], r["flops"], r["n_layers"], r["seq_len"]
    per = {row["params"] for row in p["per_layer"]}
    per_txt = f"{per.pop():,}" if len(per) == 1 else "varies"
    d = r["config"]["hidden_size"]
    return "\n".join([
        f"normlab count: {r['preset']} (d_model {d}, {L} layers, sequence length {T})",
        "",
        f"Norm parameters per layer:      {per_txt}  (2 LayerNorms x (gamma + beta) x {d})",
        f"Norm parameters in {L} layers:  {p['in_layers']:,}",
        f"Other norm parameters:          {p['outside_layers']:,}  ({', '.join(p['outside_names']) or '-'})",
        f"All norm parameters:            {p['total_norm']:,} of {p['total_model']:,} "
        f"({100 * p['share']:.3f}% of the model)",
        "",
        "Forward FLOPs per token per layer",
        f"  one LayerNorm:  {f['per_norm']:>12,}  (5 x d: mean, centre, variance, scale, affine;"
        " a multiply-add counts once)",
        f"  both norms:     {f['norms']:>12,}",
        f"  attention:      {f['attention']:>12,}  (8 d^2 + 4 T d)",
        f"  feed-forward:   {f['ffn']:>12,}  (4 d d_ff)",
        f"  norm share:     {100 * f['norm_share']:>11.3f}%",
        f"One LayerNorm over a {T}-token sequence: {f['per_norm'] * T:,} FLOPs (~{f['per_norm'] * T:.1e})",
    ])
