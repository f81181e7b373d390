"""Structural claims checked on the modules: DeepNorm constants (8), the Conformer's norms (15)."""
from __future__ import annotations

import operator

import torch

from ..models.conformer import ConformerBlock
from ..models.placement import deepnorm_alpha, deepnorm_beta
from ..models.transformer import TransformerBlock
from ..nn.residual import materialize
from .base import Context, claim, finish, pyplot
from .criteria import CRITERIA

NAME, TITLE = "structure", "DeepNorm constants and the Conformer's norm placement"


def deepnorm_cell(cfg: dict) -> dict:
    """DeepNorm block vs a Pre block built from the same seed: which weights were scaled, by how much."""
    n = cfg["layers"]
    torch.manual_seed(cfg["seed"])
    deep = TransformerBlock(64, 4, 128, placement="deepnorm", n_layers=n)
    torch.manual_seed(cfg["seed"])
    plain = TransformerBlock(64, 4, 128, placement="post", n_layers=n)
    names = {"q": "attn.fn.q_proj", "k": "attn.fn.k_proj", "v": "attn.fn.v_proj",
             "out": "attn.fn.out_proj", "fc1": "ffn.fn.fc1", "fc2": "ffn.fn.fc2"}
    weight = {m: operator.attrgetter(f"{path}.weight") for m, path in names.items()}  # fused q/k/v: views
    scale = {k: (get(deep) / get(plain)).mean().item() for k, get in weight.items()}
    return {"alpha": {u: getattr(deep, u).alpha for u in ("attn", "ffn")}, "scale": scale,
            "alpha_formula": (2 * n) ** 0.25, "beta_formula": (8 * n) ** -0.25, "alpha_lib": deepnorm_alpha(n),
            "beta_lib": deepnorm_beta(n)}


def conformer_cell(cfg: dict) -> dict:
    """Per-frame statistics of what enters each branch and what leaves the block."""
    torch.manual_seed(cfg["seed"])
    blk = ConformerBlock(64, 4, kernel_size=7).eval()
    x = torch.randn(4, 30, 64) * 3 + 1
    seen = {}
    hooks = [getattr(blk, u).fn.register_forward_pre_hook(
        lambda m, args, u=u: seen.__setitem__(u, args[0].detach())) for u in ("ffn1", "attn", "conv", "ffn2")]
    with torch.no_grad():
        y = materialize(*blk(x))  # the block's output stream
    for h in hooks:
        h.remove()
    stat = {u: {"max_abs_mean": t.mean(-1).abs().max().item(), "mean_std": t.std(-1, unbiased=False).mean().item()}
            for u, t in seen.items()}
    return {"branch_inputs": stat, "output": {"max_abs_mean": y.mean(-1).abs().max().item(),
                                               "mean_std": y.std(-1, unbiased=False).mean().item()}}


def run(ctx: Context) -> dict:
    # the cells' measurements, without the store's bookkeeping (its "status")
    d, c = ({k: v for k, v in r.items() if k != "status"} for r in (
        ctx.runner.map(NAME, deepnorm_cell, [{"layers": 12, "seed": 0}])[0],
        ctx.runner.map(NAME, conformer_cell, [{"seed": 0}])[0]))
    c8, c15 = CRITERIA["8"], CRITERIA["15"]
    beta, tol, mmax, stol = d["beta_formula"], c8["tol"], c15["mean_max"], c15["std_tol"]
    alpha_ok = all(abs(a - d["alpha_formula"]) < tol for a in d["alpha"].values())
    scaled_ok = all(abs(d["scale"][k] - beta) < tol for k in ("v", "out", "fc1", "fc2"))
    unscaled_ok = all(abs(d["scale"][k] - 1) < tol for k in ("q", "k"))
    branch_ok = all(s["max_abs_mean"] < mmax and abs(s["mean_std"] - 1) < stol for s in c["branch_inputs"].values())
    out_ok = c["output"]["max_abs_mean"] < mmax and abs(c["output"]["mean_std"] - 1) < stol
    exact = "none: deterministic module structure (seed 0)"
    claims = [
        claim("8", "DeepNorm, encoder-only: alpha = (2N)^(1/4); beta = (8N)^(-1/4) scales the FFN, value and output "
                   "projections only", "Wang et al. 2022, §4.3", d,
              c8, alpha_ok and abs(d["beta_lib"] - beta) < tol
              and abs(d["alpha_lib"] - d["alpha_formula"]) < tol and scaled_ok and unscaled_ok, exact),
        claim("15", "Conformer: each module is a pre-norm residual unit and every block ends with a LayerNorm",
              "Gulati et al. 2020", c, c15, branch_ok and out_ok, exact),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    units = list(c["branch_inputs"]) + ["output"]
    stds = [c["branch_inputs"][u]["mean_std"] for u in units[:-1]] + [c["output"]["mean_std"]]
    ax.bar(units, stds, color=["C0"] * 4 + ["C2"])
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set(ylabel="mean per-frame std", title="Conformer: what each branch sees (input std 3)", ylim=(0, 1.3))
    return finish(ctx, fig, NAME, TITLE, claims)
