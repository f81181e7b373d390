"""Every model x placement x norm: where the norms actually sit, traced from the computation.

The trace records, in execution order, every sublayer call (attention, FFN,
convolution module: input and output) and every call of a residual-level norm
(forward hooks: a norm that does the fused add is called with ``residual=`` and
returns ``(y, s)``). Slots are then read off the data, not the config:

* pre: the sublayer's input is the output of the norm applied just before it;
* branch: a norm is applied to the sublayer's output itself;
* post: the next norm's input is ``alpha * h + scale * f`` with ``h`` the sublayer's input;
* closing norms (a stack's final norm, a Conformer block's last norm) are the rest.
"""
from __future__ import annotations

import math

import pytest
import torch

import normlab
from normlab.diarization import EENDModel, ModelConfig
from normlab.models.conformer import ConvModule
from normlab.nn.attention import MultiHeadSelfAttention
from normlab.nn.feedforward import FeedForward
from normlab.registry import NORMS, PLACEMENTS

N_LAYERS = 4  # mixln: layer 0 post, layers 1-3 pre
D, HEADS = 16, 2
SUBLAYERS = (MultiHeadSelfAttention, FeedForward, ConvModule)
NORM_TYPES = tuple(t for t in (normlab.LayerNorm, normlab.RMSNorm, normlab.ScaleNorm, normlab.DyT))


def _expected_unit(placement: str, layer: int) -> tuple[bool, bool, bool, float]:
    """(pre, branch, post, alpha) as the placement table states it, written out by hand."""
    if placement == "mixln":
        placement = "post" if layer < 1 else "pre"
    return {
        "pre": (True, False, False, 1.0),
        "post": (False, False, True, 1.0),
        "sandwich": (True, True, False, 1.0),
        "deepnorm": (False, False, True, (2 * N_LAYERS) ** 0.25),
        "admin": (False, False, True, math.sqrt((2 * N_LAYERS + 1) / math.log(2 * N_LAYERS + 1) - 1)),
    }[placement]


def _build(kind: str, norm: str, placement: str):
    """(model, input, units per layer, closing norms per pre-style ending, unit branch scales)."""
    torch.manual_seed(0)
    if kind == "transformer":
        m = normlab.TransformerEncoder(D, HEADS, N_LAYERS, 32, norm=norm, placement=placement)
        return m, torch.randn(2, 6, D), ["attn", "ffn"], "stack"
    if kind == "conformer":
        m = normlab.ConformerEncoder(D, HEADS, N_LAYERS, 32, input_dim=10, kernel_size=3, norm=norm,
                                     placement=placement)
        return m, torch.randn(2, 6, 10), ["ffn1", "attn", "conv", "ffn2"], "block"
    if kind in ("video-divided", "video-joint"):
        m = normlab.VideoEncoder(D, HEADS, N_LAYERS, 32, n_patches=3, attention=kind.split("-")[1], norm=norm,
                                 placement=placement)
        units = ["time", "space", "ffn"] if kind == "video-divided" else ["attn", "ffn"]
        return m, torch.randn(2, 4, 3, D), units, "stack"
    encoder = kind.split("-")[1]
    m = EENDModel(ModelConfig(input_dim=10, d_model=D, n_heads=HEADS, n_layers=N_LAYERS, d_ff=32, norm=norm,
                              placement=placement, encoder=encoder, dropout=0.0))
    units = ["attn", "ffn"] if encoder == "transformer" else ["ffn1", "attn", "conv", "ffn2"]
    return m, torch.randn(2, 6, 10), units, "stack" if encoder == "transformer" else "block"


def _perturb_norms(model) -> None:
    """Non-trivial norm parameters and running statistics, so no norm is close to the identity."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (*NORM_TYPES, normlab.registry.MaskedBatchNorm)):
                floats = [b for b in m.buffers(recurse=False) if b.is_floating_point()]
                for t in [*m.parameters(recurse=False), *floats]:
                    t.copy_(0.5 + torch.rand(t.shape, generator=gen))


def _inside_sublayer(name: str, sublayer_names: list[str]) -> bool:
    return any(name.startswith(s + ".") for s in sublayer_names)


def _trace(model, x):
    _perturb_norms(model)
    events: list[tuple] = []
    named = dict(model.named_modules())
    sublayers = [n for n, m in named.items() if isinstance(m, SUBLAYERS)]
    norms = {n: m for n, m in named.items() if isinstance(m, (*NORM_TYPES, normlab.registry.MaskedBatchNorm))
             and not _inside_sublayer(n, sublayers)}

    def on_norm(m, args, kwargs, out):
        if kwargs.get("residual") is not None:  # the norm did the residual add: (y, s)
            events.append(("norm", m, out[1].detach(), out[0].detach()))
        else:
            events.append(("norm", m, args[0].detach(), out.detach()))

    handles = []
    for n in sublayers:
        handles.append(named[n].register_forward_pre_hook(lambda m, a: events.append(("in", m, a[0].detach()))))
        handles.append(named[n].register_forward_hook(lambda m, a, o: events.append(("out", m, o.detach()))))
    for m in norms.values():
        handles.append(m.register_forward_hook(on_norm, with_kwargs=True))
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return events, len(norms)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.equal(a.reshape(-1), b.reshape(-1))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.allclose(a.reshape(-1), b.reshape(-1), rtol=1e-5, atol=1e-5)


def _read_slots(events, scales):
    """Per sublayer call: (pre, branch, post, alpha); and the number of norms no unit claimed."""
    claimed: set[int] = set()
    found = []
    calls = [i for i, e in enumerate(events) if e[0] == "in"]
    for k, i in enumerate(calls):
        h, f = events[i][2], next(e[2] for e in events[i:] if e[0] == "out" and e[1] is events[i][1])
        j_out = next(j for j in range(i, len(events)) if events[j][0] == "out" and events[j][1] is events[i][1])
        prev = i - 1 if i > 0 else None
        pre = prev is not None and events[prev][0] == "norm" and prev not in claimed and _same(events[prev][3], h)
        if pre:
            claimed.add(prev)
        nxt = j_out + 1
        branch = nxt < len(events) and events[nxt][0] == "norm" and _same(events[nxt][2], f)
        if branch:
            claimed.add(nxt)
            f = events[nxt][3]
            nxt += 1
        post, alpha = False, 1.0
        if nxt < len(events) and events[nxt][0] == "norm":
            for a in (1.0, (2 * N_LAYERS) ** 0.25, math.sqrt((2 * N_LAYERS + 1) / math.log(2 * N_LAYERS + 1) - 1)):
                if _close(events[nxt][2], a * h + scales[k] * f):
                    post, alpha = True, a
                    claimed.add(nxt)
                    break
        found.append((pre, branch, post, alpha))
    n_norm_events = sum(e[0] == "norm" for e in events)
    return found, n_norm_events - len(claimed)


MODELS = ["transformer", "conformer", "video-divided", "video-joint", "eend-transformer", "eend-conformer"]
TRACED_NORMS = [n for n in NORMS if n != "none"]


@pytest.mark.parametrize("norm", TRACED_NORMS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("kind", MODELS)
def test_norms_sit_where_the_placement_says(kind, placement, norm):
    model, x, units, closing = _build(kind, norm, placement)
    events, n_norms = _trace(model, x)
    scales = [0.5 if u in ("ffn1", "ffn2") else 1.0 for u in units] * N_LAYERS
    found, unclaimed = _read_slots(events, scales)
    assert len(found) == len(units) * N_LAYERS
    for k, got in enumerate(found):
        layer = k // len(units)
        pre, branch, post, alpha = _expected_unit(placement, layer)
        assert got[:3] == (pre, branch, post), f"{kind} {placement} {norm}: unit {units[k % len(units)]} of " \
                                               f"layer {layer} has slots {got[:3]}, expected {(pre, branch, post)}"
        if post:
            assert got[3] == pytest.approx(alpha)
    pre_style_layers = [i for i in range(N_LAYERS) if _expected_unit(placement, i)[0]]
    if closing == "stack":
        expected_closing = 1 if (N_LAYERS - 1) in pre_style_layers else 0
    else:  # every pre-style Conformer block ends with its own norm
        expected_closing = len(pre_style_layers)
    assert unclaimed == expected_closing, f"{kind} {placement} {norm}: {unclaimed} closing norms"
    assert n_norms == sum(e[0] == "norm" for e in events), "every residual-level norm is applied exactly once"


@pytest.mark.parametrize("kind", MODELS)
def test_norm_none_applies_no_norm(kind):
    model, x, _, _ = _build(kind, "none", "pre")
    events, n_norms = _trace(model, x)
    assert n_norms == 0 and not [e for e in events if e[0] == "norm"]


def test_unknown_placement_and_norm_refused_by_every_model():
    for build in (lambda **kw: normlab.TransformerEncoder(D, HEADS, 2, **kw),
                  lambda **kw: normlab.ConformerEncoder(D, HEADS, 2, input_dim=10, **kw),
                  lambda **kw: normlab.VideoEncoder(D, HEADS, 2, n_patches=3, **kw),
                  lambda **kw: EENDModel(ModelConfig(input_dim=10, d_model=D, n_heads=HEADS, encoder="conformer",
                                                     **kw))):
        with pytest.raises(ValueError, match="valid: pre, post"):
            build(placement="middle")
        with pytest.raises(ValueError, match="valid: layernorm"):
            build(norm="groupnorm")


@pytest.mark.parametrize("kind", ["transformer", "conformer", "video-divided", "video-joint"])
def test_deepnorm_init_in_every_model(kind):
    """DeepNet: value/output projections and the FFN (and the Conformer's pointwise maps) start at beta."""
    torch.manual_seed(0)
    n, d = 12, 64
    if kind == "transformer":
        m = normlab.TransformerEncoder(d, 4, n, 128, placement="deepnorm", init="xavier")
    elif kind == "conformer":
        m = normlab.ConformerEncoder(d, 4, n, 128, input_dim=10, placement="deepnorm", init="xavier")
    else:
        m = normlab.VideoEncoder(d, 4, n, 128, n_patches=3, attention=kind.split("-")[1], placement="deepnorm",
                                 init="xavier")
    beta = (8 * n) ** -0.25

    def gain(lin):  # empirical std / xavier-normal std
        return lin.weight.std().item() / math.sqrt(2 / (lin.in_features + lin.out_features))

    checked = 0
    for mod in m.modules():
        if isinstance(mod, MultiHeadSelfAttention):
            qk, vo = mod.init_groups()
            assert all(gain(lin) == pytest.approx(1.0, rel=0.15) for lin in qk)
            assert all(gain(lin) == pytest.approx(beta, rel=0.15) for lin in vo)
            checked += 1
        elif isinstance(mod, (FeedForward, ConvModule)):
            assert all(gain(lin) == pytest.approx(beta, rel=0.15) for lin in mod.init_groups()[1])
            checked += 1
    assert checked >= 2 * n
