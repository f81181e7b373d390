"""Every claim's criterion, written once, before the run (``docs/studies.md`` prints the same texts).

A :class:`~normlab.studies.base.Criterion` holds the limits a study compares
with and the text the report prints, so the two cannot drift apart; a test
checks that each text below appears verbatim in ``docs/studies.md``. The
limits follow the papers' statements; none was moved after a run. Depths
and step counts are those of ``--quick`` and the full report; at test size a
study uses ``CRITERIA[id].at(...)`` with its smaller depths.
"""
from __future__ import annotations

from .base import Criterion


def branch_ratio_prediction(d: int = 64, d_ff: int = 128) -> float:
    """Var[F]/Var[x + F] of a Post-LN FFN unit at init: Xavier-normal W1, W2, zero biases, ReLU, unit-variance x.

    Var[W1 x] = d * 2/(d + d_ff); ReLU keeps half the second moment; Var[F] = d_ff * that / 2 * 2/(d + d_ff).
    """
    v = 2 * d * d_ff / (d + d_ff) ** 2
    return v / (1 + v)


C = Criterion
CRITERIA: dict[str, Criterion] = {
    "L1": C("max |token mean| < {mean_max} and max |token var - 1| < {var_max} on both shapes",
            mean_max=1e-5, var_max=1e-3),
    "14": C("LN bitwise identical with new batch mates and at batch 1; BN (train) changes by > {bn_min}; "
            "BN at batch 1 in eval equals the running-statistics formula (within {eval_atol})", bn_min=1e-3,
            eval_atol=1e-6),
    "L2": C("a padded batch gives bitwise the same valid frames as the short sequence alone"),
    "L3": C("InstanceNorm: per-channel time mean < {chan_max} but per-token mean > {token_min}",
            chan_max=1e-5, token_min=0.05),
    "L4": C("mean |token mean| after RMSNorm > {min} (input mean 10, std 5)", min=0.5),
    "1": C("per-example a_n, c_n: LN: scale, shift, weight-matrix re-scaling and re-centering < {tol}, half "
           "the units' weight vectors re-scaled > {moved}; RMSNorm and ScaleNorm: scale and re-scaling < {tol}, shift "
           "and re-centering > {moved}", tol=1e-5, moved=1e-2),
    "8": C("exact ({tol}): both units' alpha (attention, FFN) and the library constants equal the formulas; v, out, "
           "fc1, fc2 scaled by beta; q, k unscaled", tol=1e-6),
    "15": C("every branch input and the block output: per-frame |mean| < {mean_max}, std within {std_tol} of 1",
            mean_max=1e-4, std_tol=1e-2),
    "12a": C("reference implementations, {n}x{d} float32 forward+backward, best of {repeats}: RMSNorm time "
             "<= {max}x LayerNorm's", n=8192, d=256, repeats=7, max=0.93),
    "2": C("Pre ||x_l||^2/d within [1 + l/2, 1 + 3l/2] for l = 1..{layers}; Post LN input ||x^(post,5)_l||^2/d "
           "within {post_pred} +- {post_tol} for every l (d_ff = d, W_Q = W_K = 0, x_0 ~ N(0, I), mean of seeds)",
           layers=24, post_pred=1.5, post_tol=0.15),
    "3": C("RMS over positions of one position's loss gradient of the last W2, mean of {seeds} seeds: "
           "Pre g{top}/g6 <= {pre_max}; Post flat, g{top}/g6 in [{post_min}, {post_max}]", seeds=20, top=24,
           pre_max=0.75, post_min=0.8, post_max=1.25),
    "4": C("||E[dL/dW2]||_F over {batches} batches, mean of {seeds} seeds, mean(top third)/mean(bottom third) at "
           "L = {depths}: Post > {post_min}; Pre and DeepNorm flat, in [{flat_lo}, {flat_hi}], at every depth",
           batches=16, seeds=20, depths=(6, 12, 24), post_min=1.1, flat_lo=0.8, flat_hi=1.25),
    "10": C("FFN units, L = {layers}, mean of seeds: Post mean over layers within {post_pred} +- {post_tol} "
            "(Xavier + ReLU prediction, d_ff = 128); Pre last layer < {pre_max}",
            layers=24, post_pred=round(branch_ratio_prediction(), 3), post_tol=0.03, pre_max=0.15),
    "11": C("mean of seeds: Pre layer {layers} > {pre_min}; Post < {post_max}", layers=24, pre_min=0.95, post_max=0.8),
    "7a": C("random-sign +-lr perturbation of every parameter Adam moves, lr 1e-5, 2 heads, squared output change, "
            "mean of seeds: Post d({top})/d(6) >= {post_min}; Pre and Admin <= {sub_max}; Post/DeepNorm at "
            "L={top} >= {deep_min}; DeepNorm's d({top}) the smallest", top=100, post_min=10, sub_max=8, deep_min=10),
    "7b": C("one Adam step, lr 1e-5, 2 heads, squared output change, mean of seeds, the limits Thm 2 implies: "
            "Post d({top})/d(6) >= {post_min}; Pre and Admin <= {sub_max}; Post/DeepNorm at L={top} >= {deep_min}; "
            "DeepNorm's d({top}) the smallest", top=100, post_min=10, sub_max=8, deep_min=10),
    "5": C("L=6, ReLU FFN, lr 3e-3, {steps} steps, each condition in a majority of seeds: Post without warmup "
           "> {post_fail}; Post with {warmup}-step warmup < {trained}; Pre without warmup < {trained}",
           steps=300, warmup=100, post_fail=2.0, trained=0.1),
    "6": C("L={layers}, lr 1e-3 and 3e-3, no warmup: Post > {post_fail} in a majority of seeds; Pre and DeepNorm "
           "mean of seeds < {trained}", layers=12, post_fail=2.0, trained=0.1),
    "9": C("L={layers}, lr 1e-3, no warmup: mean final loss < {trained}, where plain Post-LN (claim 6's runs) "
           "stays above {post_fail} in a majority of seeds", layers=12, trained=0.1, post_fail=2.0),
    "13": C("Pre, L=6, lr 1e-3: DyT mean final loss < {max}", max=0.05),
    "12b": C("Pre, L=6, lr 1e-3: |mean loss(RMSNorm) - mean loss(LayerNorm)| <= {max}", max=0.01),
    "G1": C("lr x depth grid, a cell counts as trained if a majority of seeds reach loss < {trained}: "
            "Pre trains in more cells than Post", trained=0.5),
    "G2": C("lr x depth grid, a cell counts as trained if a majority of seeds reach loss < {trained}: "
            "no norm trains in fewer cells than Pre", trained=0.5),
    "D1": C("mean test DER (collar 0.25 s) over seeds, on each test set (unheard synthesizer voices; unheard real "
            "persons where installed): Pre-LN <= Post-LN + {margin} point, Pre-LN's finite (a diverged seed makes "
            "its mean inf, which never passes)", margin=1),
    "D2": C("mean test DER (collar 0.25 s) over seeds, on each test set: no norm > Pre-LN + {margin} point, "
            "Pre-LN's finite", margin=1),
}
