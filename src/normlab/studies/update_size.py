"""Claims 7a, 7b: how much one update moves the output, by depth (Liu et al. 2020, Thm 2; DeepNet Thm 4.2).

Liu et al.'s Thm 2 bounds the output change for a parameter perturbation
independent of W: O(N) for Post-LN, O(log N) for Pre-LN. Adam's first step
is ~ -lr sign(g), which is tied to W through the gradient, so the two are
measured apart: 7a perturbs every parameter Adam would move by +-lr with
random signs (the theorem's setting), 7b takes the real Adam step and
reports it against the same limits.
"""
from __future__ import annotations

from .base import Context, claim, finish, interval, mean, pyplot
from .criteria import CRITERIA
from .probes import update_cell

NAME, TITLE = "update_size", "Output change after one update vs depth (Liu et al. 2020; Wang et al. 2022)"
PLACEMENTS = ("post", "pre", "admin", "deepnorm")
KINDS = {"7a": ("delta_random", "random-sign +-lr perturbation"), "7b": ("delta_adam", "one Adam step")}


def _growth(pairs):
    return mean(b for _, b in pairs) / mean(a for a, _ in pairs)


def run(ctx: Context) -> dict:
    depths = ctx.pick([6, 18, 50], [6, 18, 50, 100], [6, 18, 50, 100])
    top = depths[-1]
    seeds = [ctx.seed_offset + s for s in range(ctx.pick(2, 6, 10))]  # one step, no training: more seeds than 3
    cfgs = [{"placement": p, "layers": n, "heads": 2, "lr": 1e-5, "seed": s}
            for p in PLACEMENTS for n in depths for s in seeds]
    res = iter(ctx.runner.map(NAME, update_cell, cfgs))
    runs = {(p, n): [next(res) for _ in seeds] for p in PLACEMENTS for n in depths}
    claims, delta = [], {}
    for cid, (key, _what) in KINDS.items():
        crit = CRITERIA[cid].at(top=top)
        d = {p: {n: mean(r[key] for r in runs[(p, n)]) for n in depths} for p in PLACEMENTS}
        pairs = {p: [(a[key], b[key]) for a, b in zip(runs[(p, 6)], runs[(p, top)])] for p in PLACEMENTS}
        growth = {p: d[p][top] / d[p][6] for p in PLACEMENTS}
        post_vs_deep = d["post"][top] / d["deepnorm"][top]
        smallest = all(d["deepnorm"][top] < d[p][top] for p in PLACEMENTS if p != "deepnorm")
        ok = (growth["post"] >= crit["post_min"] and growth["pre"] <= crit["sub_max"]
              and growth["admin"] <= crit["sub_max"] and post_vs_deep >= crit["deep_min"] and smallest)
        measured = {f"d(L={top})/d(6)": growth, f"post/deepnorm at L={top}": post_vs_deep,
                    f"deepnorm smallest at L={top}": smallest,
                    f"depth ratio {top}/6 (linear growth)": top / 6,
                    "mean squared change": {p: [d[p][n] for n in depths] for p in PLACEMENTS}}
        if cid == "7b":
            measured["note"] = ("Adam's step is -lr sign(g): tied to W through g, the layers' output changes add up "
                                "coherently, which Thm 2's independent perturbation does not assume")
        per_seed = [b / a for a, b in pairs["pre"]]
        statement = {"7a": "With a perturbation independent of W (Thm 2's setting), the output change grows ~linearly "
                           "with depth for Post-LN, sublinearly for Pre-LN and Admin; DeepNorm's is smallest",
                     "7b": "After a real Adam step, the output change grows ~linearly with depth for Post-LN, "
                           "sublinearly for Pre-LN and Admin; DeepNorm's is smallest"}[cid]
        claims.append(claim(cid, statement, "Liu et al. 2020, Thm 2; Wang et al. 2022, Thm 4.2, Fig. 5", measured,
                            crit, ok,
                            f"90% bootstrap over {len(seeds)} seeds: "
                            + "; ".join(interval(f"{p} growth", pairs[p], _growth) for p in PLACEMENTS)
                            + f"; pre per seed {min(per_seed):.3g} to {max(per_seed):.3g}"))
        delta[cid] = d
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, cid in zip(axes, KINDS):
        for p in PLACEMENTS:
            ax.plot(depths, [delta[cid][p][n] for n in depths], "o-", label=p)
        ax.set(xscale="log", yscale="log", xlabel="layers L", ylabel="mean |f(x; W') - f(x; W)|^2",
               title=f"{cid}: {KINDS[cid][1]}, lr 1e-5")
        ax.legend(fontsize=7)
    return finish(ctx, fig, NAME, TITLE, claims)
