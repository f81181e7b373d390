"""At initialization, by depth: hidden-state growth, gradients, branch dependence, layer similarity.

Claims 2, 3, 4, 10, 11 of STUDIES.md (Xiong et al. 2020; Liu et al. 2020; Li et al. 2024).
"""
from __future__ import annotations

from .base import Context, claim, finish, mean, pyplot
from .task import init_cell

NAME, TITLE = "init_depth", "At initialization: growth, gradients, branch dependence (Xiong, Liu, Mix-LN)"


def _rows(ctx, placement, layers, **extra):
    # Xiong et al.'s and Liu et al.'s analyses assume a ReLU feed-forward (and Xavier init, zero biases)
    cfgs = [{"placement": placement, "layers": layers, "seed": s, "activation": "relu", **extra} for s in ctx.seeds]
    return [r["rows"] for r in ctx.runner.map(NAME, init_cell, cfgs)]


def _avg(rows_per_seed, key):
    """Per-layer mean over seeds."""
    return [mean(rows[i][key] for rows in rows_per_seed) for i in range(len(rows_per_seed[0]))]


def run(ctx: Context) -> dict:
    L = 24
    lemma = {"d_ff": 64, "zero_qk": True, "gaussian_input": True, "no_pos": True}
    growth = {p: _avg(_rows(ctx, p, L, **lemma), "resid_norm2_per_d") for p in ("pre", "post")}
    pre_ok = all(1 + l / 2 <= v <= 1 + 3 * l / 2 for l, v in enumerate(growth["pre"], start=1))
    post_ok = all(abs(v - 1) <= 0.05 for v in growth["post"])

    depths = ctx.pick([6, 12], [6, 12, 24], [6, 12, 24])
    profile = {(p, n): _avg(_rows(ctx, p, n), "grad_ffn_w2") for p in ("pre", "post", "deepnorm") for n in depths}
    last = {p: {n: profile[(p, n)][-1] for n in depths} for p in ("pre", "post")}
    ratio = {p: last[p][depths[-1]] / last[p][6] for p in ("pre", "post")}

    def top_bottom(v):
        k = max(1, len(v) // 3)
        return mean(v[-k:]) / mean(v[:k])

    tb = {f"{p}/L{n}": top_bottom(profile[(p, n)]) for (p, n) in profile}
    post_tb = all(tb[f"post/L{n}"] > 1.1 for n in depths)
    pre_tb = all(tb[f"pre/L{n}"] < 0.9 for n in depths)
    deep_tb = all(0.8 <= tb[f"deepnorm/L{n}"] <= 1.25 for n in depths)

    diag = {p: _rows(ctx, p, L) for p in ("pre", "post")}
    branch = {p: _avg(diag[p], "branch_ratio_ffn") for p in diag}
    cos = {p: _avg(diag[p], "cos_prev") for p in diag}

    claims = [
        claim("2", "Hidden-state norm at init: Post-LN stays ~d, Pre-LN grows linearly with depth",
              "Xiong et al. 2020, Lemma 2", {"pre ||x_l||^2/d": growth["pre"][::4] + [growth["pre"][-1]],
                                             "post ||x_l||^2/d": growth["post"][::4] + [growth["post"][-1]]},
              "Pre within [1 + l/2, 1 + 3l/2] for l = 1..24; Post within 1 +- 0.05 (d_ff = d, W_Q = W_K = 0)",
              pre_ok and post_ok),
        claim("3", "Last-layer FFN gradient at init: Post-LN flat in depth, Pre-LN shrinks like L^(-1/2)",
              "Xiong et al. 2020, Thm 1, Fig. 3c,d", {"g_L/g_6": ratio, "last-layer grad": last},
              f"Pre g{depths[-1]}/g6 <= 0.75; Post g{depths[-1]}/g6 >= 0.8",
              ratio["pre"] <= 0.75 and ratio["post"] >= 0.8),
        claim("4", "Per-layer FFN-W2 gradient at init: Post-LN larger near the output; Pre-LN not; DeepNorm flat",
              "Xiong et al. 2020, Fig. 3a,b; Wang et al. 2022", {"mean(top third)/mean(bottom third)": tb},
              "Post > 1.1, Pre < 0.9, DeepNorm in [0.8, 1.25] at every depth", post_tb and pre_tb and deep_tb),
        claim("10", "Dependence on the residual branch Var[F]/Var[x+F]: Post-LN ~0.5 at every layer, Pre-LN decays ~1/l",
              "Liu et al. 2020", {"post mean": mean(branch["post"]), "pre last": branch["pre"][-1],
                                  "pre first": branch["pre"][0]},
              "Post mean over layers in [0.3, 0.7]; Pre last layer < 0.15 (FFN units, L = 24)",
              0.3 <= mean(branch["post"]) <= 0.7 and branch["pre"][-1] < 0.15),
        claim("11", "Deep Pre-LN layers approach the identity: cos(x_l, x_(l+1)) -> 1",
              "Li et al. 2024 (Mix-LN); Sun et al. 2025", {"pre layer 24": cos["pre"][-1], "post layer 24": cos["post"][-1]},
              "Pre layer 24 > 0.95; Post < 0.8", cos["pre"][-1] > 0.95 and cos["post"][-1] < 0.8),
    ]
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    ls = range(1, L + 1)
    ax = axes[0]
    ax.plot(ls, growth["pre"], "o-", ms=3, label="Pre-LN")
    ax.plot(ls, growth["post"], "s-", ms=3, label="Post-LN")
    ax.fill_between(ls, [1 + l / 2 for l in ls], [1 + 1.5 * l for l in ls], alpha=0.15, label="Lemma 2 band")
    ax.set(xlabel="layer l", ylabel="||x_l||^2 / d", title="Residual stream at init")
    ax.legend(fontsize=7)
    ax = axes[1]
    for p in ("post", "pre", "deepnorm"):
        v = profile[(p, depths[-1])]
        ax.plot(range(1, len(v) + 1), v, "o-", ms=3, label=p)
    ax.set(xlabel="layer", ylabel="||dL/dW2||_F", yscale="log", title=f"FFN W2 gradient, L={depths[-1]}")
    ax.legend(fontsize=7)
    ax = axes[2]
    for p in ("post", "pre"):
        ax.plot(ls, branch[p], "o-", ms=3, label=p)
    ax.set(xlabel="layer", ylabel="Var[F] / Var[x + F]", title="Branch dependence (FFN)")
    ax.legend(fontsize=7)
    ax = axes[3]
    for p in ("post", "pre"):
        ax.plot(ls, cos[p], "o-", ms=3, label=p)
    ax.set(xlabel="layer", ylabel="cos(x_(l-1), x_l)", title="Consecutive-layer similarity")
    ax.legend(fontsize=7)
    return finish(ctx, fig, NAME, TITLE, claims)
