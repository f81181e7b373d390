"""The lessons' own claims about LayerNorm's statistics, on audio and video shapes."""
from __future__ import annotations

import torch
from torch import nn

from ..lab.lesson import batch_dependence
from ..norms import LayerNorm, RMSNorm
from .base import Context, claim, finish, pyplot
from .criteria import CRITERIA

NAME, TITLE = "lesson_stats", "LayerNorm statistics (lessons 000 and 003)"
LESSON = "lessons 000/003"
EXACT = "none: deterministic, no seed dependence (one input, seed 0)"


def stats_cell(cfg: dict) -> dict:
    g = torch.Generator().manual_seed(cfg["seed"])
    audio = torch.randn(4, 50, 64, generator=g) * 5 + 10  # B, T, D
    video = torch.randn(2, 8, 16, 64, generator=g) * 3 - 2  # B, T, N, D
    ln = LayerNorm(64)
    with torch.no_grad():
        ya, yv = ln(audio), ln(video)
        # companions: the same frame with different batch mates
        mates = torch.randn(7, 64, generator=g) * 5 + 10  # M, D
        batch = batch_dependence(audio[0, :1], audio[1:4, 0], mates)
        # variable length: a short sequence padded inside a batch
        pad = torch.zeros(2, 50, dtype=torch.bool)
        pad[0, 30:] = True
        padded = audio[:2].clone()
        padded[0, 30:] = 1e3
        ln_padded_same = torch.equal(ln(padded)[0, :30], ln(audio[:1, :30])[0])
        # InstanceNorm normalizes each channel over time, not each frame over channels
        inorm = nn.InstanceNorm1d(64)(audio.transpose(1, 2)).transpose(1, 2)  # B, T, D
        rms = RMSNorm(64)(audio)
    return {
        "audio_max_abs_token_mean": ya.mean(-1).abs().max().item(),
        "audio_max_abs_token_var_minus_1": (ya.var(-1, unbiased=False) - 1).abs().max().item(),
        "video_max_abs_token_mean": yv.mean(-1).abs().max().item(),
        "video_max_abs_token_var_minus_1": (yv.var(-1, unbiased=False) - 1).abs().max().item(),
        **batch,
        "ln_padded_bitwise_same": ln_padded_same,
        "instancenorm_max_abs_token_mean": inorm.mean(-1).abs().max().item(),
        "instancenorm_max_abs_channel_time_mean": inorm.mean(1).abs().max().item(),
        "rms_mean_abs_token_mean": rms.mean(-1).abs().mean().item(),
        "ln_token_means": ya.mean(-1)[0, :12].tolist(),
        "rms_token_means": rms.mean(-1)[0, :12].tolist(),
        "in_token_means": inorm.mean(-1)[0, :12].tolist(),
    }


def run(ctx: Context) -> dict:
    (r,) = ctx.runner.map(NAME, stats_cell, [{"seed": 0}])
    c = CRITERIA
    claims = [
        claim("L1", "LayerNorm brings each token of [B, T, D] audio and [B, T, N, D] video to mean 0, variance 1",
              LESSON, {k: r[k] for k in r if k.startswith(("audio", "video"))},
              c["L1"], max(r["audio_max_abs_token_mean"], r["video_max_abs_token_mean"]) < c["L1"]["mean_max"]
              and max(r["audio_max_abs_token_var_minus_1"], r["video_max_abs_token_var_minus_1"]) < c["L1"]["var_max"],
              EXACT),
        claim("14", "LayerNorm's statistics do not depend on the batch; BatchNorm's do", LESSON,
              {k: r[k] for k in ("ln_bitwise_same_with_new_mates", "bn_train_change_with_new_mates",
                                 "bn_batch1_eval_max_diff", "ln_batch1_bitwise_same")},
              c["14"], r["ln_bitwise_same_with_new_mates"] and r["ln_batch1_bitwise_same"]
              and r["bn_train_change_with_new_mates"] > c["14"]["bn_min"]
              and r["bn_batch1_eval_max_diff"] <= c["14"]["eval_atol"],
              EXACT),
        claim("L2", "LayerNorm handles variable-length sequences: padding never changes a valid frame", LESSON,
              {"ln_padded_bitwise_same": r["ln_padded_bitwise_same"]}, c["L2"], r["ln_padded_bitwise_same"], EXACT),
        claim("L3", "InstanceNorm normalizes each channel over time; LayerNorm each token over channels", LESSON,
              {k: r[k] for k in ("instancenorm_max_abs_token_mean", "instancenorm_max_abs_channel_time_mean")},
              c["L3"], r["instancenorm_max_abs_channel_time_mean"] < c["L3"]["chan_max"]
              and r["instancenorm_max_abs_token_mean"] > c["L3"]["token_min"], EXACT),
        claim("L4", "RMSNorm only rescales: it does not remove the mean", LESSON,
              {"rms_mean_abs_token_mean": r["rms_mean_abs_token_mean"]}, c["L4"],
              r["rms_mean_abs_token_mean"] > c["L4"]["min"], EXACT),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    t = range(12)
    series = (("ln_token_means", "LayerNorm"), ("rms_token_means", "RMSNorm"), ("in_token_means", "InstanceNorm"))
    for key, label in series:
        ax.plot(t, r[key], marker="o", label=label)
    ax.set(xlabel="frame t (recording 0)", ylabel="mean over the 64 features", title="Per-token mean after each norm")
    ax.legend()
    return finish(ctx, fig, NAME, TITLE, claims)
