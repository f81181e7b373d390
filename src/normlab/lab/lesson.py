"""The lessons' exercises, reproduced and checked: ``normlab lesson``.

Lesson 000 asks for a hand-written LayerNorm compared with ``torch.nn.LayerNorm``
on a simulated audio batch ``x = randn(2, 4, 6) * 5 + 10`` (seed 42), the
per-token mean and variance after normalization, and a minimal Pre-Norm block
``x + sublayer(norm(x))``. Lesson 003 repeats it at ``[128, 768]`` and counts
parameters. Both lessons contrast LayerNorm with BatchNorm, InstanceNorm and
RMSNorm; the report shows each on the same input.

:func:`run_lesson` returns plain numbers (JSON-able); :func:`format_lesson`
renders them; the CLI only chooses between the two.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .. import reference
from .._checks import BadValue
from ..batchnorm import MaskedBatchNorm
from ..norms import LayerNorm, RMSNorm


@dataclass(frozen=True)
class LessonConfig:
    batch: int = 2  # B: recordings in the batch (lesson 000)
    tokens: int = 4  # T: frames per recording
    d_model: int = 6  # D: features per frame
    seed: int = 42  # the lesson's torch.manual_seed
    scale: float = 5.0  # x = randn * scale + shift: deliberately off-scale input
    shift: float = 10.0


class PreNormBlock(nn.Module):
    """The lesson's minimal Pre-Norm block: ``y = x + sublayer(norm(x))``."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.sublayer = nn.Linear(d_model, d_model)  # stands in for attention or the FFN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.sublayer(self.norm(x))  # B, T, D


def _stats(y: torch.Tensor, expected_var: torch.Tensor) -> dict:
    """Per-token mean and (biased) variance over the last dim, and summaries; ``expected_var``: what each token's
    variance should be, ``var_x / (var_x + eps)``."""
    mean = y.mean(dim=-1)  # B, T
    var = y.var(dim=-1, unbiased=False)  # B, T
    var64 = y.double().var(dim=-1, unbiased=False)  # B, T   measured in float64: only LayerNorm's rounding remains
    return {
        "mean": mean.tolist(),
        "var": var.tolist(),
        "max_abs_mean": mean.abs().max().item(),
        "max_abs_var_minus_1": (var - 1).abs().max().item(),
        "max_abs_var_minus_expected": (var64 - expected_var).abs().max().item(),
        "mean_std": y.std(dim=-1).mean().item(),  # lesson 003: unbiased std, averaged over tokens
    }


def batch_dependence(frame: torch.Tensor, mates_a: torch.Tensor, mates_b: torch.Tensor) -> dict:
    """One frame beside two sets of batch mates: LayerNorm against BatchNorm, the lessons' contrast.

    ``frame``: ``(1, D)``; ``mates_a``, ``mates_b``: ``(M, D)``. BatchNorm is
    :class:`~normlab.batchnorm.MaskedBatchNorm` (torch's BatchNorm1d statistics)
    in training mode, then in eval mode on the frame alone. With no mates
    (``M = 0``) the training-mode comparison is undefined and reads None.
    """
    d = frame.shape[-1]
    ln, bn = LayerNorm(d), MaskedBatchNorm(d).train()
    a, b = torch.cat([frame, mates_a]), torch.cat([frame, mates_b])  # M+1, D (x2)
    with torch.no_grad():
        bn_change = (bn(a)[0] - bn(b)[0]).abs().max().item() if len(mates_a) and len(mates_b) else None
        try:
            bn(frame)
            bn_train_alone = "ran"
        except ValueError as e:  # batch statistics of one frame are undefined
            bn_train_alone = f"error: {e}"
        bn.eval()
        expected = (frame - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
        return {
            "ln_bitwise_same_with_new_mates": torch.equal(ln(a)[0], ln(b)[0]),
            "ln_batch1_bitwise_same": torch.equal(ln(frame)[0], ln(a)[0]),
            "bn_train_change_with_new_mates": bn_change,
            "bn_batch1_train": bn_train_alone,
            "bn_batch1_eval_max_diff": float((bn(frame) - expected).abs().max()),  # from the running statistics
        }


def _batch_mates(x_tokens: torch.Tensor, seed: int) -> dict:
    """Token 0 beside its own batch mates and beside new ones: LayerNorm vs BatchNorm (train mode)."""
    g = torch.Generator().manual_seed(seed + 1)
    others = torch.randn(x_tokens.shape, generator=g) * x_tokens.std() + x_tokens.mean()  # N, D
    return batch_dependence(x_tokens[:1], x_tokens[1:], others[1:])


def run_lesson(cfg: LessonConfig = LessonConfig()) -> dict:
    """Run the lessons' exercise and return every figure and criterion."""
    B, T, D = cfg.batch, cfg.tokens, cfg.d_model
    for name, v in (("batch", B), ("tokens", T), ("d_model", D), ("seed", cfg.seed)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise BadValue(f"{name} must be a whole number >= 0, got {v!r}")
    if min(B, T, D) < 1:
        raise BadValue(f"batch, tokens and d_model must be >= 1, got {B}, {T}, {D}")
    if D < 4:  # with 2 or 3 features a token's variance can be near 0, and var / (var + eps) then misses 1
        raise BadValue(f"d_model must be >= 4 (over fewer features a token's variance can vanish into eps), got {D}")
    if T < 2:
        raise BadValue(f"tokens must be >= 2 (InstanceNorm, compared here, normalizes over the frames), got {T}")
    if B * T < 3:  # over two values BatchNorm gives -1 and 1 whatever they are: no companion can change token 0
        raise BadValue(f"batch x tokens must be >= 3 (BatchNorm over two values is always -1 and 1), got {B * T}")
    torch.manual_seed(cfg.seed)
    x = torch.randn(B, T, D) * cfg.scale + cfg.shift  # B, T, D   simulated audio frames

    ours = LayerNorm(D)
    theirs = nn.LayerNorm(D)
    theirs.load_state_dict(ours.state_dict())  # same gamma/beta; keys are torch's
    with torch.no_grad():
        y_hand, _ = reference.layer_norm_forward(x, ours.weight, ours.bias, ours.eps)  # B, T, D
        y_mod = ours(x)  # B, T, D
        y_torch = theirs(x)  # B, T, D

        block = PreNormBlock(D)
        norm_x = block.norm(x)  # B, T, D
        sub = block.sublayer(norm_x)  # B, T, D
        res = x + sub  # B, T, D
        y_block = block(x)  # B, T, D

        y_rms = RMSNorm(D)(x)  # B, T, D
        inorm = nn.InstanceNorm1d(D)(x.transpose(1, 2)).transpose(1, 2)  # B, T, D  per channel over T

    # What LayerNorm computes, in float64 from the float32 input (gamma = 1, beta = 0 as initialized). eps keeps a
    # token's variance at var_x / (var_x + eps), short of 1 by about eps / var_x: far from 1 for the near-constant
    # tokens a large batch of few features holds
    x64 = x.double()  # B, T, D
    var_x = x64.var(dim=-1, unbiased=False)  # B, T
    rstd = torch.rsqrt(var_x + ours.eps)  # B, T
    # float32 holds x to about 6e-8 of |x|, and normalizing multiplies that by rstd (up to 1/sqrt(eps) for a
    # near-constant token): two correct float32 LayerNorms differ by about that much, so each token's difference is
    # measured in units of 1 + rstd * max|x|
    magnification = 1 + rstd * x64.abs().amax(dim=-1)  # B, T

    shapes = {
        "input": list(x.shape),
        "hand_written": list(y_hand.shape),
        "normlab_module": list(y_mod.shape),
        "torch": list(y_torch.shape),
        "norm(x)": list(norm_x.shape),
        "sublayer(norm(x))": list(sub.shape),
        "x + sublayer(norm(x))": list(res.shape),
        "block": list(y_block.shape),
    }
    ln_stats = _stats(y_hand, var_x / (var_x + ours.eps))
    comparisons = {
        "batchnorm": _batch_mates(x.reshape(B * T, D), cfg.seed),
        "rmsnorm_max_abs_token_mean": y_rms.mean(dim=-1).abs().max().item(),
        "rmsnorm_mean_token_rms": y_rms.pow(2).mean(dim=-1).sqrt().mean().item(),
        "instancenorm_max_abs_token_mean": inorm.mean(dim=-1).abs().max().item(),
        "instancenorm_max_abs_channel_mean_over_time": inorm.mean(dim=1).abs().max().item() if T > 1 else None,
    }
    errors = {
        "hand_vs_torch": (y_hand - y_torch).abs().max().item(),
        "module_vs_torch": (y_mod - y_torch).abs().max().item(),
    }
    scaled_errors = {  # each token's difference over its magnification
        "hand_vs_torch": _scaled_error(y_hand, y_torch, magnification),
        "module_vs_torch": _scaled_error(y_mod, y_torch, magnification),
    }
    overall = {
        "x_mean": x.mean().item(),
        "x_std": x.std(unbiased=False).item(),
        "norm_x_mean": norm_x.mean().item(),
        "norm_x_std": norm_x.std(unbiased=False).item(),
    }
    n_params = sum(p.numel() for p in ours.parameters())
    finite = all(bool(torch.isfinite(t).all()) for t in (y_hand, y_mod, y_torch, y_block, y_rms))
    bn = comparisons["batchnorm"]
    criteria = [
        ("outputs are finite", finite, "no NaN or Inf in any output (hand-written, module, torch, block, RMSNorm)"),
        ("shapes stay [B, T, D]", all(s == [B, T, D] for s in shapes.values()), f"every output is {[B, T, D]}"),
        _below("hand-written == torch", "max abs error / (1 + rstd * max|x|)", max(scaled_errors.values()), "1e-6"),
        _below("per-token mean ~ 0", "max |mean|", ln_stats["max_abs_mean"], "1e-5"),
        _below("per-token variance ~ 1", "max |var - var_x / (var_x + eps)|", ln_stats["max_abs_var_minus_expected"],
               "1e-5"),
        ("parameters = 2 * D", n_params == 2 * D, f"{n_params} == {2 * D}"),
        (
            "LN ignores batch companions",
            bn["ln_bitwise_same_with_new_mates"] and bn["ln_batch1_bitwise_same"],
            "token 0 bitwise identical with new companions and alone",
        ),
        (  # any change: it shrinks like 1/sqrt(B * T) (0.0015 at 8e6 tokens), below any fixed floor at some batch
            "BatchNorm depends on companions",
            B * T > 1 and bn["bn_train_change_with_new_mates"] > 0,
            f"token 0 changes by {bn['bn_train_change_with_new_mates'] or 0:.3g} > 0",
        ),
        (
            "RMSNorm does not centre",
            comparisons["rmsnorm_max_abs_token_mean"] > 0.1,
            f"max |token mean| {comparisons['rmsnorm_max_abs_token_mean']:.3f} > 0.1",
        ),
    ]
    return {
        "config": asdict(cfg),
        "shapes": shapes,
        "max_abs_error": errors,
        "max_scaled_error": scaled_errors,
        "layernorm": ln_stats,
        "overall": overall,
        "parameters": n_params,
        "comparisons": comparisons,
        "criteria": [{"name": n, "pass": bool(ok), "detail": d} for n, ok, d in criteria],
        "passed": all(ok for _, ok, _ in criteria),
    }


def _scaled_error(y: torch.Tensor, y_torch: torch.Tensor, magnification: torch.Tensor) -> float:
    """The largest over tokens of ``max |y - y_torch|`` divided by the token's ``magnification``."""
    return ((y - y_torch).abs().amax(dim=-1).double() / magnification).max().item()


def _below(name: str, what: str, value: float, limit: str) -> tuple[str, bool, str]:
    """The criterion ``value < limit`` (``limit`` as written, "1e-5"), its line saying which side the value is on
    (``< 1e-5``, or ``>= 1e-5`` where it fails)."""
    ok = value < float(limit)
    return name, ok, f"{what} {value:.2e} {'<' if ok else '>='} {limit}"


def _table(rows: list[list[float]], title: str) -> list[str]:
    out = [title]
    header = "        " + "".join(f"  t={t:<8d}" for t in range(len(rows[0])))
    out.append(header)
    for b, row in enumerate(rows):
        out.append(f"  b={b:<4d}" + "".join(f"  {v:+.3e}" for v in row))
    return out


def format_lesson(r: dict) -> str:
    """Human-readable report of :func:`run_lesson`'s result."""
    c = r["config"]
    ln, ov, cmp_ = r["layernorm"], r["overall"], r["comparisons"]
    lines = [
        f"normlab lesson: LayerNorm on x = randn{tuple(r['shapes']['input'])} * {c['scale']:g} + {c['shift']:g}"
        f"  (seed {c['seed']})",
        "",
        "Shapes",
    ]
    lines += [f"  {k:<24s} {v}" for k, v in r["shapes"].items()]
    lines += [
        "",
        f"Max abs difference vs torch.nn.LayerNorm: hand-written {r['max_abs_error']['hand_vs_torch']:.3e}, "
        f"normlab.LayerNorm {r['max_abs_error']['module_vs_torch']:.3e}",
        "",
    ]
    if c["batch"] * c["tokens"] <= 32:
        lines += _table(ln["mean"], "Per-token mean after LayerNorm")
        lines += [""] + _table(ln["var"], "Per-token variance after LayerNorm (biased)") + [""]
    lines += [
        f"After LayerNorm: max |token mean| {ln['max_abs_mean']:.3e}, max |token var - 1| "
        f"{ln['max_abs_var_minus_1']:.3e}, mean token std (unbiased, as lesson 003) {ln['mean_std']:.4f}",
        f"Overall: x mean {ov['x_mean']:.4f} std {ov['x_std']:.4f} -> norm(x) mean {ov['norm_x_mean']:.4f} "
        f"std {ov['norm_x_std']:.4f}",
        f"LayerNorm parameters: {r['parameters']} (gamma and beta, 2 x {c['d_model']})",
        "",
        "Other norms on the same input",
        f"  BatchNorm (train): token 0 changes by "
        f"{cmp_['batchnorm']['bn_train_change_with_new_mates'] or 0:.4f} when its "
        "batch companions change; LayerNorm: "
        + ("bitwise identical" if cmp_["batchnorm"]["ln_bitwise_same_with_new_mates"] else "CHANGED"),
        f"  BatchNorm (train) on one token: {cmp_['batchnorm']['bn_batch1_train']}",
        f"  RMSNorm: max |token mean| {cmp_['rmsnorm_max_abs_token_mean']:.4f} (no centring), "
        f"mean token RMS {cmp_['rmsnorm_mean_token_rms']:.4f}",
        f"  InstanceNorm (per channel over time): max |token mean| {cmp_['instancenorm_max_abs_token_mean']:.4f}",
        "",
        "Acceptance criteria",
    ]
    lines += [f"  {'PASS' if k['pass'] else 'FAIL'}  {k['name']:<32s} {k['detail']}" for k in r["criteria"]]
    n_pass = sum(k["pass"] for k in r["criteria"])
    lines.append(f"{n_pass} passed, {len(r['criteria']) - n_pass} failed")
    return "\n".join(lines)
