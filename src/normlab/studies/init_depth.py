"""At initialization, by depth: hidden-state growth, gradients, branch dependence, layer similarity.

Claims 2, 3, 4, 10, 11 of docs/studies.md (Xiong et al. 2020; Liu et al. 2020; Li et al. 2024), each on
the quantity its paper states: claim 2's Post half on the LN input x^(post,5); claim 3 on one
position's loss gradient; claim 4 on the expected gradient over 16 batches; claim 10 against the branch
ratio predicted for Xavier + ReLU. Every mean is over seeds, with a 90% bootstrap interval over seeds.
"""
from __future__ import annotations

import math

from .base import Context, claim, finish, interval, mean, pyplot
from .criteria import CRITERIA, branch_ratio_prediction
from .probes import grad_cell
from .task import D_FF, D, init_cell

NAME, TITLE = "init_depth", "At initialization: growth, gradients, branch dependence (Xiong, Liu, Mix-LN)"


SHALLOW = ("Post-LN's top/bottom ratio grows with depth; at L = 6 and d = 64 it stays within a few percent of 1, "
           "below the criterion's 1.1 (Xiong's Fig. 3 is a 6-layer model at d = 512)")


PRE_FALLS = ("Pre-LN's expected gradient falls toward the output (top/bottom below the flat band): not larger "
             "near the output, as Post-LN's, but not the same in every layer either, as Xiong's Fig. 3 shows")


def _rows(ctx, placement, layers, seeds, **extra):
    # Xiong et al.'s and Liu et al.'s analyses assume a ReLU feed-forward (and Xavier init, zero biases)
    cfgs = [{"placement": placement, "layers": layers, "seed": s, "activation": "relu", **extra} for s in seeds]
    return [r["rows"] for r in ctx.runner.map(NAME, init_cell, cfgs)]


def _avg(rows_per_seed, key):
    """Per-layer mean over seeds."""
    return [mean(rows[i][key] for rows in rows_per_seed) for i in range(len(rows_per_seed[0]))]


def _ratio(pairs):
    """mean of the second / mean of the first, over seeds."""
    return mean(b for _, b in pairs) / mean(a for a, _ in pairs)


def _top_bottom(v):
    k = max(1, len(v) // 3)
    return mean(v[-k:]) / mean(v[:k])


def _tb_of_seeds(profiles):
    """top/bottom ratio of the seed-mean profile (profiles: one per-layer list per seed)."""
    return _top_bottom([mean(p[i] for p in profiles) for i in range(len(profiles[0]))])


def loglog_slope(values: list[float]) -> float:
    """Least-squares slope of log(value) against log(layer index, from 1): the exponent of a power-law decay."""
    xs = [math.log(i) for i in range(1, len(values) + 1)]
    ys = [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def gradient_claim_holds(ratio: dict, c3) -> bool:
    """Claim 3 on the per-position ratios g_top/g6: Pre-LN shrinks to at most ``pre_max``, Post-LN stays flat
    (within [``post_min``, ``post_max``]: a gradient growing with depth is not flat either)."""
    return ratio["pre"] <= c3["pre_max"] and c3["post_min"] <= ratio["post"] <= c3["post_max"]


def run(ctx: Context) -> dict:
    seeds = ctx.init_seeds
    # each claim reads its own entry; cells two claims share (claims 3 and 4's gradient cells, 10 and 11's task
    # model) are the same configurations, which the runner computes once
    c2, c10, c11 = CRITERIA["2"], CRITERIA["10"], CRITERIA["11"]
    c3, c4 = CRITERIA["3"], CRITERIA["4"]
    if ctx.scale == "test":
        c3, c4 = c3.at(top=12), c4.at(depths=(6, 12))
    depths, top, deepest = list(c4["depths"]), c3["top"], c4["depths"][-1]
    L = c2["layers"]

    # claim 2: Lemma 2's setting (d_ff = d, W_Q = W_K = 0, x_0 ~ N(0, I), no positions)
    lemma = {"d_ff": D, "zero_qk": True, "gaussian_input": True, "no_pos": True, "ln_input": True}
    lem = {p: _rows(ctx, p, L, seeds, **lemma) for p in ("pre", "post")}
    pre_growth = _avg(lem["pre"], "resid_norm2_per_d")
    post_in = _avg(lem["post"], "ffn_sum_norm2_per_d")
    pre_ok = all(1 + i / 2 <= v <= 1 + 3 * i / 2 for i, v in enumerate(pre_growth, start=1))
    post_ok = all(abs(v - c2["post_pred"]) <= c2["post_tol"] for v in post_in)

    # claims 3 and 4: the gradient cells (claim 3 reads one position of the first of claim 4's batches)
    def grads(placements, layers, n_seeds):
        seeds_ = [ctx.seed_offset + s for s in range(n_seeds)]
        cfgs = [{"placement": p, "layers": n, "seed": s, "activation": "relu", "batches": c4["batches"]}
                for p in placements for n in layers for s in seeds_]
        res = iter(ctx.runner.map(NAME, grad_cell, cfgs))
        return {(p, n): [next(res) for _ in seeds_] for p in placements for n in layers}, seeds_

    g, gseeds = grads(("pre", "post", "deepnorm"), depths, c4["seeds"])
    g3, g3seeds = grads(("pre", "post"), (6, top), c3["seeds"])
    pos = {p: list(zip(*[[r["last_per_position_rms"] for r in g3[(p, n)]] for n in (6, top)])) for p in ("pre", "post")}
    bat = {p: list(zip(*[[r["w2_one_batch"][-1] for r in g3[(p, n)]] for n in (6, top)])) for p in ("pre", "post")}
    ratio = {p: _ratio(pos[p]) for p in pos}
    xnorm = {n: mean(r["last_x_norm2_per_d"] for r in g3[("pre", n)]) for n in (6, top)}
    predicted = (xnorm[6] / xnorm[top]) ** 0.5  # Thm 1: the gradient scales like 1/||x_L||
    profile = {k: [r["w2_expected"] for r in v] for k, v in g.items()}
    tb = {f"{p}/L{n}": _tb_of_seeds(profile[(p, n)]) for (p, n) in profile}
    post_tb = all(tb[f"post/L{n}"] > c4["post_min"] for n in depths)
    flat = lambda v: c4["flat_lo"] <= v <= c4["flat_hi"]  # noqa: E731   Xiong's "about the same" in every layer
    pre_tb = all(flat(tb[f"pre/L{n}"]) for n in depths)
    deep_tb = all(flat(tb[f"deepnorm/L{n}"]) for n in depths)
    one_batch_tb = {f"post/L{n}": _tb_of_seeds([r["w2_one_batch"] for r in g[("post", n)]]) for n in depths}
    per_seed_tb = [_top_bottom(p) for p in profile[("post", deepest)]]

    # claims 10 and 11: the task model (d_ff = 128, ReLU, learned positions)
    diag = {p: _rows(ctx, p, c10["layers"], seeds) for p in ("pre", "post")}
    branch = {p: _avg(diag[p], "branch_ratio_ffn") for p in diag}
    L11 = c11["layers"]
    diag11 = {p: _rows(ctx, p, L11, seeds) for p in ("pre", "post")}
    cos = {p: _avg(diag11[p], "cos_prev") for p in diag11}
    post_branch = mean(branch["post"])

    lemma_note = "Lemma 2: E||x^(post,5)||^2/d = 3/2 (LN input); the LN output is 1 by construction"
    claims = [
        claim("2", "Hidden-state norm at init: Pre-LN grows linearly with depth; Post-LN's LN input stays at 3d/2",
              "Xiong et al. 2020, Lemma 2",
              {"pre ||x_l||^2/d": pre_growth[::4] + [pre_growth[-1]],
               "post ||x^(post,5)_l||^2/d": post_in[::4] + [post_in[-1]],
               "post min, max over layers": [min(post_in), max(post_in)], "note": lemma_note},
              c2, pre_ok and post_ok,
              f"90% bootstrap over {len(seeds)} seeds: "
              + interval(f"pre l={L}", [r[-1]["resid_norm2_per_d"] for r in lem["pre"]], mean) + "; "
              + interval("post mean over layers", [mean(x["ffn_sum_norm2_per_d"] for x in r) for r in lem["post"]],
                         mean)),
        claim("3", "Last-layer FFN gradient at init: Post-LN flat in depth, Pre-LN shrinks like 1/||x_L|| ~ L^(-1/2)",
              "Xiong et al. 2020, Thm 1",
              {f"per-position g{top}/g6": ratio, "pre predicted sqrt(||x_6||^2/||x_L||^2)": predicted,
               f"per-position g (L=6, {top})": {p: [mean(a for a, _ in pos[p]), mean(b for _, b in pos[p])]
                                                 for p in pos},
               f"batch-mean gradient g{top}/g6 (not the theorem's quantity)": {p: _ratio(bat[p]) for p in bat}},
              c3, gradient_claim_holds(ratio, c3),
              f"90% bootstrap over {len(g3seeds)} seeds: " + interval(f"pre g{top}/g6", pos["pre"], _ratio) + "; "
              + interval(f"post g{top}/g6", pos["post"], _ratio)),
        claim("4", "Per-layer FFN-W2 expected gradient at init: Post-LN larger near the output; Pre-LN and "
                   "DeepNorm flat", "Xiong et al. 2020, Fig. 3; Wang et al. 2022",
              {"expected gradient, mean(top third)/mean(bottom third)": tb,
               "one batch, post": one_batch_tb,
               f"post/L{deepest} per seed, min, max": [min(per_seed_tb), max(per_seed_tb)],
               **({"note": SHALLOW} if tb["post/L6"] <= c4["post_min"] else {}),
               **({"pre note": PRE_FALLS} if not pre_tb else {})},
              c4, post_tb and pre_tb and deep_tb,
              f"90% bootstrap over {len(gseeds)} seeds: "
              + "; ".join(interval(f"post/L{n}", profile[("post", n)], _tb_of_seeds) for n in depths) + "; "
              + interval(f"pre/L{deepest}", profile[("pre", deepest)], _tb_of_seeds) + "; "
              + interval(f"deepnorm/L{deepest}", profile[("deepnorm", deepest)], _tb_of_seeds)),
        claim("10", "Dependence on the residual branch Var[F]/Var[x+F]: Post-LN constant in depth "
                    f"(predicted {branch_ratio_prediction(D, D_FF):.3f} for Xavier + ReLU, d_ff = {D_FF}; "
                    "the paper's ~0.5 assumes Var[F] = Var[x]), Pre-LN decays ~1/l", "Liu et al. 2020",
              {"post mean": post_branch, "predicted": branch_ratio_prediction(D, D_FF),
               "pre last": branch["pre"][-1], "pre first": branch["pre"][0],
               # what the criterion does not test, printed beside it: the Post profile's spread over layers and
               # the Pre profile's decay exponent (the paper's 1/l is -1)
               "post min, max over layers": [min(branch["post"]), max(branch["post"])],
               "pre log-log slope": loglog_slope(branch["pre"])},
              c10, abs(post_branch - c10["post_pred"]) <= c10["post_tol"] and branch["pre"][-1] < c10["pre_max"],
              f"90% bootstrap over {len(seeds)} seeds: "
              + interval("post mean", [mean(x["branch_ratio_ffn"] for x in r) for r in diag["post"]], mean) + "; "
              + interval("pre last", [r[-1]["branch_ratio_ffn"] for r in diag["pre"]], mean)),
        claim("11", "Deep Pre-LN layers approach the identity: cos(x_l, x_(l+1)) -> 1",
              "Li et al. 2024 (Mix-LN); Sun et al. 2025",
              {f"pre layer {L11}": cos["pre"][-1], f"post layer {L11}": cos["post"][-1]},
              c11, cos["pre"][-1] > c11["pre_min"] and cos["post"][-1] < c11["post_max"],
              f"90% bootstrap over {len(seeds)} seeds: "
              + interval("pre", [r[-1]["cos_prev"] for r in diag11["pre"]], mean) + "; "
              + interval("post", [r[-1]["cos_prev"] for r in diag11["post"]], mean)),
    ]
    return finish(ctx, _plot(pre_growth, post_in, profile, branch, cos, deepest, c2), NAME, TITLE, claims)


def _plot(pre_growth, post_in, profile, branch, cos, top, c2):
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    ls = range(1, len(pre_growth) + 1)
    ax = axes[0]
    ax.plot(ls, pre_growth, "o-", ms=3, label="Pre-LN ||x_l||^2/d")
    ax.plot(ls, post_in, "s-", ms=3, label="Post-LN LN input ||x^(post,5)||^2/d")
    ax.fill_between(ls, [1 + i / 2 for i in ls], [1 + 1.5 * i for i in ls], alpha=0.15, label="Lemma 2 band (Pre)")
    ax.axhline(c2["post_pred"], color="C1", ls=":", label="Lemma 2: 3/2 (Post)")
    ax.set(xlabel="layer l", ylabel="||.||^2 / d", title="Residual stream at init (Lemma 2 setting)")
    ax.legend(fontsize=7)
    ax = axes[1]
    for p in ("post", "pre", "deepnorm"):
        v = [mean(s[i] for s in profile[(p, top)]) for i in range(top)]
        ax.plot(range(1, top + 1), v, "o-", ms=3, label=p)
    ax.set(xlabel="layer", ylabel="||E[dL/dW2]||_F", yscale="log", title=f"FFN W2 expected gradient, L={top}")
    ax.legend(fontsize=7)
    ax = axes[2]
    for p in ("post", "pre"):
        ax.plot(range(1, len(branch[p]) + 1), branch[p], "o-", ms=3, label=p)
    ax.axhline(branch_ratio_prediction(D, D_FF), color="C0", ls=":", label="Post prediction")
    ax.set(xlabel="layer", ylabel="Var[F] / Var[x + F]", title="Branch dependence (FFN)")
    ax.legend(fontsize=7)
    ax = axes[3]
    for p in ("post", "pre"):
        ax.plot(range(1, len(cos[p]) + 1), cos[p], "o-", ms=3, label=p)
    ax.set(xlabel="layer", ylabel="cos(x_(l-1), x_l)", title="Consecutive-layer similarity")
    ax.legend(fontsize=7)
    return fig
