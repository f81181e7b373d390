"""Per-layer activation and gradient statistics of an encoder (forward hooks).

:func:`diagnose` runs one forward (and, with ``backward=True``, one backward)
pass and returns one plain dict per layer, for the studies to tabulate/plot:

* ``resid_norm``: mean L2 norm of the layer's output tokens; ``resid_norm2_per_d``: mean ``||x||^2 / d``;
* ``token_mean`` / ``token_std``: per-token mean (absolute) and std of the output, averaged;
* ``branch_ratio_<unit>``: ``Var[F(x)] / Var[alpha x + F(x)]`` for each residual unit;
* ``cos_prev``: mean cosine similarity between this layer's and the previous layer's output tokens;
* ``grad_<group>``: L2 norm of the gradients of the layer's ``attn``/``ffn``/``norm`` parameters;
  ``grad_ffn_w2``: of the FFN's second weight matrix alone (Xiong et al.'s quantity).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as TF
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._checks import BadValue
from ..models.stack import Stack
from ..nn.residual import ResidualUnit, materialize


def _valid(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Tokens ``[M, D]`` at valid (unpadded) positions."""
    t = t.detach().float()
    if mask is None:
        return t.reshape(-1, t.shape[-1])
    if tuple(mask.shape) != tuple(t.shape[:-1]):
        raise BadValue(f"diagnose's key_padding_mask {list(mask.shape)} does not fit a stream of "
                       f"{list(t.shape)}: a mask is read on [B, T, D] streams (the video encoder's fold "
                       "patches into them: diagnose it without a mask)")
    return t[~mask]


def _probe_loss(out: torch.Tensor) -> torch.Tensor:
    """The output against a fixed random direction: a stand-in task loss that gives every layer a gradient. (The
    mean of squares does not: after a final norm with unit gain it is constant up to eps.)"""
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device)
    return (out.float() * probe).mean()


def _group(name: str) -> str:
    if "_norm." in name:
        return "norm"
    return "attn" if name.startswith("attn") else "ffn" if name.startswith("ffn") else "other"


def watch_branch(unit: ResidualUnit, fn: Callable[[torch.Tensor, torch.Tensor], None]) -> RemovableHandle:
    """Call ``fn(x, f)`` on each run of ``unit`` with its (alpha-scaled) input stream ``x`` and branch output ``f``.

    A forward hook: on the unit where it leaves its add pending (it returns
    ``(f, x)``: the add stays fused into the next norm), else on its add
    (:class:`~normlab.nn.residual.ResidualAdd`, called as a module while a hook watches it).
    """
    if unit.post_norm is None:
        return unit.register_forward_hook(lambda _m, _args, out: fn(out[1], out[0]))
    return unit.add.register_forward_hook(lambda _m, args, _out: fn(args[1], args[0]))


def diagnose(model: nn.Module, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
             backward: bool = True, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[dict]:
    """Statistics per layer of ``model.layers`` for one batch; see the module docstring.

    ``loss_fn`` maps the model output to a scalar (default: the output against a fixed random direction, a
    stand-in for a task loss that gives every layer a gradient). The statistics come from forward hooks: on
    blocks compiled with ``compile_blocks`` they fire only where the blocks were compiled after the hooks were
    added (torch.compile does not check for new hooks), and a hook that did not fire is an error, not a
    missing number.
    """
    if not isinstance(model, Stack):
        raise BadValue("model is not a normlab stack with .layers to diagnose")
    layers = list(model.layers)
    rows = [{"layer": i} for i in range(len(layers))]
    streams: dict[int, torch.Tensor] = {}  # -1: the stack's input; i: layer i's output

    def branch_ratio(i, unit_name):
        def record(x, f):
            fv, sv = _valid(f, key_padding_mask), _valid(x + f, key_padding_mask)
            rows[i][f"branch_ratio_{unit_name}"] = (fv.var() / sv.var().clamp_min(1e-30)).item()
        return record

    def output(i):
        def hook(_m, _args, out):
            streams[i] = materialize(*out).detach()
        return hook

    handles = [layers[0].register_forward_pre_hook(lambda _m, args: streams.__setitem__(-1, args[0].detach()))]
    watched = []  # (layer, unit) whose branch hook must fire
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(output(i)))
        for name, unit in layer.named_children():
            if isinstance(unit, ResidualUnit):
                handles.append(watch_branch(unit, branch_ratio(i, name)))
                watched.append((i, name))
    # the layers' gradients of the probe loss, by autograd.grad: the caller's own .grad stay as they were (a
    # zero_grad and backward here wiped them, or replaced them with the probe's)
    params = [(i, name, p) for i, layer in enumerate(layers) for name, p in layer.named_parameters()
              if p.requires_grad]
    grads: list = [None] * len(params)
    try:
        out = model(x, key_padding_mask)
        if backward and params:
            loss = loss_fn(out) if loss_fn is not None else _probe_loss(out)
            grads = torch.autograd.grad(loss, [p for _, _, p in params], allow_unused=True)
    finally:
        for h in handles:
            if h is not None:
                h.remove()
    silent = [f"layer {i} {name}" for i, name in watched if f"branch_ratio_{name}" not in rows[i]]
    if silent or len(streams) < len(layers) + 1:
        raise BadValue(f"diagnose's hooks did not fire ({', '.join(silent[:3]) or 'a layer output'}): blocks "
                       "compiled before the hooks were added do not see them; diagnose before compile_blocks")
    outputs = [streams[i] for i in range(len(layers))]
    prev = streams[-1]
    for i, o in enumerate(outputs):
        v, pv = _valid(o, key_padding_mask), _valid(prev, key_padding_mask)
        d = v.shape[-1]
        rows[i].update(
            resid_norm=v.norm(dim=-1).mean().item(),
            resid_norm2_per_d=(v.pow(2).sum(-1) / d).mean().item(),
            token_mean=v.mean(-1).abs().mean().item(),
            token_std=v.std(-1, unbiased=False).mean().item(),
            cos_prev=TF.cosine_similarity(v, pv, dim=-1).mean().item() if pv.shape == v.shape else None,
        )
        prev = o
    if backward:
        grad_of = {id(p): g for (_, _, p), g in zip(params, grads)}
        sq: list[dict[str, float]] = [{} for _ in layers]
        for (i, name, _), g in zip(params, grads):
            if g is not None:
                group = _group(name)
                sq[i][group] = sq[i].get(group, 0.0) + g.float().pow(2).sum().item()
        for i, layer in enumerate(layers):
            rows[i].update({f"grad_{g}": v**0.5 for g, v in sq[i].items()})
            w2 = getattr(getattr(getattr(layer, "ffn", None), "fn", None), "fc2", None)
            if w2 is not None and grad_of.get(id(w2.weight)) is not None:
                rows[i]["grad_ffn_w2"] = grad_of[id(w2.weight)].float().norm().item()
    return rows
