"""Claim 7: how much one update moves the output, by depth (Liu et al. 2020; DeepNet Thm 4.2)."""
from __future__ import annotations

from .base import Context, claim, finish, mean, pyplot
from .task import one_step_cell

NAME, TITLE = "update_size", "Output change after one update vs depth (Liu et al. 2020; Wang et al. 2022)"
PLACEMENTS = ("post", "pre", "admin", "deepnorm")


def run(ctx: Context) -> dict:
    depths = ctx.pick([6, 18, 50], [6, 18, 50, 100], [6, 18, 50, 100])
    cfgs = [{"placement": p, "layers": n, "heads": 2, "lr": 1e-5, "seed": s}
            for p in PLACEMENTS for n in depths for s in ctx.seeds]
    res = iter(ctx.runner.map(NAME, one_step_cell, cfgs))
    delta = {p: {n: mean(next(res)["delta"] for _ in ctx.seeds) for n in depths} for p in PLACEMENTS}
    top = depths[-1]
    growth = {p: delta[p][top] / delta[p][6] for p in PLACEMENTS}
    post_vs_deep = delta["post"][top] / delta["deepnorm"][top]
    claims = [
        claim("7", "Output change after one update grows ~linearly with depth for Post-LN, sublinearly for Pre-LN "
                   "and Admin; DeepNorm's is smallest", "Liu et al. 2020; Wang et al. 2022, Thm 4.2, Fig. 5",
              {f"delta(L={top})/delta(6)": growth, f"post/deepnorm at L={top}": post_vs_deep},
              f"one Adam step, lr 1e-5, 2 heads: Post delta({top})/delta(6) >= 10; Pre and Admin <= 8; "
              f"Post/DeepNorm at L={top} >= 10",
              growth["post"] >= 10 and growth["pre"] <= 8 and growth["admin"] <= 8 and post_vs_deep >= 10),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for p in PLACEMENTS:
        ax.plot(depths, [delta[p][n] for n in depths], "o-", label=p)
    ax.set(xscale="log", yscale="log", xlabel="layers L", ylabel="mean |f(x; W') - f(x; W)|^2",
           title="Output change after one Adam step (lr 1e-5)")
    ax.legend(fontsize=7)
    return finish(ctx, fig, NAME, TITLE, claims)
