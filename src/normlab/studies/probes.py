"""Cells at initialization that measure the papers' own quantities (claims 3, 4, 7a, 7b).

* :func:`grad_cell`: the FFN-W2 gradient of every layer, over ``batches``
  task batches at once: the Frobenius norm of the *expected* gradient (the
  gradient of the mean loss over all batches, Xiong et al.'s Fig. 3), the
  mean norm of one batch's gradient, and for the last layer the RMS over
  positions of one position's loss gradient (the quantity Xiong's Thm 1
  bounds: ``|dl_t/dW2| = |dl_t/dF_t| |h_t|``, no other position reaches the
  last FFN after it).
* :func:`update_cell`: the squared output change ``mean |f(x; W') - f(x; W)|^2``
  for a random-sign perturbation of Adam's first-step size (Liu et al.'s
  Thm 2 setting: independent of W) and for a real Adam step.
"""
from __future__ import annotations

import torch

from ..nn.residual import materialize
from .task import _eager, _model, loss_of, reversal_batch


@_eager
def grad_cell(cfg: dict) -> dict:
    model = _model(cfg)
    gen = torch.Generator().manual_seed(20_000 + cfg["seed"])
    nb = cfg["batches"]
    xs, ys = zip(*(reversal_batch(gen) for _ in range(nb)))
    x, y = torch.cat(xs), torch.cat(ys)  # nb*B, T
    layers = list(model.encoder.layers)
    seen: list[dict] = [{} for _ in layers]
    last_out: list[torch.Tensor] = []

    def fc2_hook(i):
        def hook(_m, inp, out):
            seen[i]["h"] = inp[0].detach()  # nb*B, T, F
            out.register_hook(lambda g: seen[i].__setitem__("g", g.detach()))  # d(mean loss)/dF: nb*B, T, D
        return hook

    handles = [layer.ffn.fn.fc2.register_forward_hook(fc2_hook(i)) for i, layer in enumerate(layers)]
    handles.append(layers[-1].register_forward_hook(lambda _m, _a, out: last_out.append(materialize(*out).detach())))
    try:
        loss_of(model, x, y).backward()
    finally:
        for h in handles:
            h.remove()
    n_pos = x.numel()
    expected, one_batch = [], []
    for layer, s in zip(layers, seen):
        expected.append(layer.ffn.fn.fc2.weight.grad.norm().item())
        g = s["g"].reshape(nb, -1, s["g"].shape[-1])  # nb, B*T, D
        h = s["h"].reshape(nb, -1, s["h"].shape[-1])  # nb, B*T, F
        per_batch = nb * torch.einsum("bnd,bnf->bdf", g, h)  # each batch's mean-loss gradient
        one_batch.append(per_batch.flatten(1).norm(dim=1).mean().item())
    g, h = seen[-1]["g"] * n_pos, seen[-1]["h"]  # one position's loss gradient at the last FFN output
    per_pos = g.norm(dim=-1) * h.norm(dim=-1)  # nb*B, T: |dl_t/dW2|_F
    xl = last_out[0]
    return {"w2_expected": expected, "w2_one_batch": one_batch,
            "last_per_position_rms": per_pos.pow(2).mean().sqrt().item(),
            "last_x_norm2_per_d": (xl.pow(2).sum(-1) / xl.shape[-1]).mean().item()}


@_eager
def update_cell(cfg: dict) -> dict:
    model = _model(cfg)
    gen = torch.Generator().manual_seed(30_000 + cfg["seed"])
    x, y = reversal_batch(gen)

    def output():
        with torch.no_grad():
            return model.encoder(model.emb(x))

    before = output()
    loss_of(model, x, y).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    saved = [p.detach().clone() for p in params]
    signs = torch.Generator().manual_seed(40_000 + cfg["seed"])
    with torch.no_grad():
        for p in params:  # +-lr on every entry Adam's first step moves, signs independent of W and g
            s = torch.randint(0, 2, p.shape, generator=signs).to(p.dtype) * 2 - 1
            p.add_(cfg["lr"] * s * (p.grad != 0))
    perturbed = output()
    with torch.no_grad():
        for p, v in zip(params, saved):
            p.copy_(v)
    torch.optim.Adam(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.98)).step()
    stepped = output()
    return {"delta_random": (perturbed - before).pow(2).mean().item(),
            "delta_adam": (stepped - before).pow(2).mean().item()}
