"""Whole-encoder benchmark: normlab's Pre-LN encoder against ``torch.nn.TransformerEncoder(norm_first=True)``.

Three models carry the same weights (copied through :func:`normlab.interop.to_torch`):

* ``normlab``: :class:`normlab.TransformerEncoder` as shipped (``impl="auto"`` kernels);
* ``torch``: ``torch.nn.TransformerEncoder(norm_first=True, batch_first=True)`` with a final LayerNorm
  (inference takes torch's fused encoder-layer fast path);
* ``native``: the same normlab model with every norm call forced to ``impl="native"`` (torch's kernels),
  which isolates what normlab's norm kernels contribute from what the model code does;
* ``compiled`` (optional): the normlab model after :func:`normlab.models.compile_blocks`.

Before any timing, :func:`check` compares the outputs (training-mode forward and inference) on the
non-padded positions and the input gradient: everything must agree within 1e-5, or the bench stops.
Timing (same run, same inputs), in three rounds: each repeat runs every model once, in an order that
rotates between repeats; a round's figure is the median over its repeats after warm-up, the reported
figure the median of the rounds, with their spread, in wall time and in the process's CPU time (steadier
than wall time when other processes share the cores). ``profile=True`` adds the training step's split
(:mod:`normlab.lab.step_profile`). A training step is forward,
``mean(y * g)`` over valid positions (``g`` fixed), backward, ``AdamW.step()``, ``zero_grad(set_to_none=True)``.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .. import functional as F
from ..interop import to_torch
from ..models.stack import compile_blocks
from ..models.transformer import TransformerEncoder
from .bench import kernels_note, machine

#: the bound every output comparison of the bench must meet
TOLERANCE = 1e-5


@dataclass(frozen=True)
class ModelBenchConfig:
    layers: int = 6
    d_model: int = 256
    heads: int = 4
    d_ff: int = 1024
    batch: int = 16
    tokens: int = 200
    activation: str = "relu"  # torch's default
    min_len: float = 0.5  # sequence lengths uniform in [min_len * tokens, tokens]; the first is full
    seed: int = 0


@contextlib.contextmanager
def forced_impl(impl: str) -> Iterator[None]:
    """Every ``normlab.functional`` norm call inside the block runs with ``impl=impl``."""
    names = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
    saved = {n: getattr(F, n) for n in names}
    try:
        for n in names:
            setattr(F, n, functools.partial(saved[n], impl=impl))
        yield
    finally:
        for n, fn in saved.items():
            setattr(F, n, fn)


def build(cfg: ModelBenchConfig) -> tuple[TransformerEncoder, nn.TransformerEncoder, torch.Tensor, torch.Tensor]:
    """``(normlab model, torch model with the same weights, x, key_padding_mask)``; dropout 0 everywhere."""
    torch.manual_seed(cfg.seed)
    ours = TransformerEncoder(cfg.d_model, cfg.heads, cfg.layers, cfg.d_ff, placement="pre", pos="none",
                              activation=cfg.activation)
    layers = [to_torch(block) for block in ours.layers]
    ref = nn.TransformerEncoder(layers[0], cfg.layers, norm=nn.LayerNorm(cfg.d_model, eps=ours.final_norm.eps),
                                enable_nested_tensor=False)
    ref.layers = nn.ModuleList(layers)
    ref.norm.load_state_dict(ours.final_norm.state_dict())
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(cfg.batch, cfg.tokens, cfg.d_model, generator=gen)  # B, T, D
    lo = max(1, int(cfg.min_len * cfg.tokens))
    lengths = torch.randint(lo, cfg.tokens + 1, (cfg.batch,), generator=gen)  # B
    lengths[0] = cfg.tokens
    pad = torch.arange(cfg.tokens)[None, :] >= lengths[:, None]  # B, T   True = padding
    return ours, ref, x, pad


def _run(model: nn.Module, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    if isinstance(model, nn.TransformerEncoder):
        return model(x, src_key_padding_mask=pad)
    return model(x, pad)


def _loss(y: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """``mean(y * g)`` over valid positions with a fixed pseudo-random ``g``: a loss whose input gradient
    is well conditioned (``mean(y**2)`` of a LayerNorm output is nearly constant, its gradient nearly 0)."""
    return (y * _probe(tuple(y.shape), y.dtype))[~pad].mean()


@functools.lru_cache(maxsize=4)
def _probe(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(7), dtype=dtype)  # B, T, D


def check(ours: nn.Module, ref: nn.Module, x: torch.Tensor, pad: torch.Tensor) -> dict:
    """Largest differences on valid positions: training forward, input gradient, inference."""
    valid = ~pad  # B, T
    ours.train(), ref.train()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = _run(ours, xa, pad), _run(ref, xb, pad)
    _loss(ya, pad).backward()
    _loss(yb, pad).backward()
    ours.zero_grad(set_to_none=True), ref.zero_grad(set_to_none=True)
    ours.eval(), ref.eval()
    with torch.inference_mode():
        ia, ib = _run(ours, x, pad), _run(ref, x, pad)
    out = {"train_forward": (ya - yb)[valid].abs().max().item(),
           "input_grad": (xa.grad - xb.grad)[valid].abs().max().item() / xb.grad[valid].abs().max().item(),
           "inference": (ia - ib)[valid].abs().max().item()}
    out["passed"] = all(v <= TOLERANCE for v in out.values())
    return out


def _timer(fn: Callable[[], None]) -> tuple[float, float]:
    """``(wall seconds, process CPU seconds)`` of one call."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def _rotating_medians(fns: dict[str, Callable[[], None]], repeats: int, warmup: int
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU milliseconds per model; each repeat runs every model, the order rotating."""
    names = list(fns)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + repeats):
        order = names[i % len(names):] + names[:i % len(names)]
        for n in order:
            w, c = _timer(fns[n])
            if i >= warmup:
                wall[n].append(w)
                cpu[n].append(c)
    med = lambda d: {n: statistics.median(v) * 1e3 for n, v in d.items()}  # noqa: E731
    return med(wall), med(cpu)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x, pad, ctx) -> Callable[[], None]:
    def step() -> None:
        with ctx():
            _loss(_run(model, x, pad), pad).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return step


def _infer(model: nn.Module, x, pad, ctx) -> Callable[[], None]:
    def fwd() -> None:
        with ctx(), torch.inference_mode():
            _run(model, x, pad)
    return fwd


def _spread(values: list[float]) -> float:
    """(max - min) / median of the rounds, in percent."""
    return round(100 * (max(values) - min(values)) / statistics.median(values), 1)


def run(cfg: ModelBenchConfig = ModelBenchConfig(), repeats: int = 7, warmup: int = 2, compiled: bool = False,
        rounds: int = 3, profile: bool = False, progress: Callable | None = None) -> dict:
    """Check, then time training steps and inference in ``rounds`` rounds; the figures are the median over
    rounds of each round's median (ms), with the rounds' spread; ``profile``: the training step's split too."""
    ours, ref, x, pad = build(cfg)
    correctness = check(ours, ref, x, pad)
    if not correctness["passed"]:
        raise AssertionError(f"normlab and torch encoders disagree beyond {TOLERANCE}: {correctness}")
    native = TransformerEncoder(cfg.d_model, cfg.heads, cfg.layers, cfg.d_ff, placement="pre", pos="none",
                                activation=cfg.activation)
    native.load_state_dict(ours.state_dict())
    plain = contextlib.nullcontext
    models = {"normlab": (ours, plain), "torch": (ref, plain), "native": (native, lambda: forced_impl("native"))}
    if compiled:
        comp = TransformerEncoder(cfg.d_model, cfg.heads, cfg.layers, cfg.d_ff, placement="pre", pos="none",
                                  activation=cfg.activation)
        comp.load_state_dict(ours.state_dict())
        models["compiled"] = (compile_blocks(comp), plain)
    result = {"machine": machine(), "config": asdict(cfg), "tolerance": TOLERANCE, "correctness": correctness,
              "repeats": repeats, "rounds": rounds}
    jobs = [(mode, r) for mode in ("train_step", "inference") for r in range(rounds)]
    per_round: dict[str, list] = {"train_step": [], "inference": []}
    for i, (mode, r) in enumerate(jobs):
        fns = {}
        for name, (model, ctx) in models.items():
            model.train(mode == "train_step")
            if mode == "train_step":
                fns[name] = _train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), x, pad, ctx)
            else:
                fns[name] = _infer(model, x, pad, ctx)
        per_round[mode].append(_rotating_medians(fns, repeats, warmup + (3 if compiled and r == 0 else 0)))
        if progress:  # job i is done (counted from 0)
            progress(i, len(jobs) + profile, f"{mode} round {r + 1}/{rounds}")
    for mode, rs in per_round.items():
        ms = {n: statistics.median(w[n] for w, _ in rs) for n in models}
        cpu = {n: statistics.median(c[n] for _, c in rs) for n in models}
        result[mode] = {"ms": {n: round(v, 2) for n, v in ms.items()},
                        "speedup_vs_torch": {n: round(ms["torch"] / v, 3) for n, v in ms.items() if n != "torch"},
                        "cpu_ms": {n: round(v, 2) for n, v in cpu.items()},
                        "cpu_speedup_vs_torch": {n: round(cpu["torch"] / v, 3) for n, v in cpu.items()
                                                 if n != "torch"},
                        "rounds_ms": {n: [round(w[n], 2) for w, _ in rs] for n in models},
                        "spread_pct": {n: _spread([w[n] for w, _ in rs]) for n in models},
                        "speedup_rounds": {n: [round(w["torch"] / w[n], 3) for w, _ in rs] for n in models
                                           if n != "torch"}}
    if profile:
        from . import step_profile

        opts = {}

        def make_step(model, ctx):
            opt = opts.setdefault(id(model), torch.optim.AdamW(model.parameters(), lr=1e-4))
            return _train_step(model, opt, x, pad, ctx)

        result["profile"] = step_profile.run({n: models[n] for n in ("normlab", "torch")}, make_step)
        if progress:
            progress(len(jobs), len(jobs) + 1, "profile")
    return result


def markdown(result: dict) -> str:
    """The results table (milliseconds, medians; speed-up = torch time / model time)."""
    c = result["config"]
    lines = [f"{c['layers']}-layer Pre-LN encoder, d {c['d_model']}, {c['heads']} heads, d_ff {c['d_ff']}, "
             f"{c['activation']}, B {c['batch']}, T {c['tokens']} (lengths {c['min_len']:g}T..T), float32; "
             f"{result['machine']['threads']} threads, torch {result['machine']['torch']}, "
             f"median of {result['repeats']} per round, median of {result.get('rounds', 1)} rounds"
             + (f"; load average {result['machine']['load'][0]:g} at the start" if result['machine'].get('load')
                else "") + kernels_note(result["machine"]) + ".",
             "",
             "| model | training step ms | x torch | (CPU time: x torch) | inference ms | x torch | "
             "(CPU time: x torch) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    tr, inf = result["train_step"], result["inference"]

    def x(r: dict, key: str, name: str) -> str:
        v = r[key].get(name)
        return "1" if v is None else f"{v:.2f}"

    for n in tr["ms"]:
        lines.append(f"| {n} | {tr['ms'][n]:.1f} | {x(tr, 'speedup_vs_torch', n)} | {x(tr, 'cpu_speedup_vs_torch', n)} "
                     f"| {inf['ms'][n]:.1f} | {x(inf, 'speedup_vs_torch', n)} | {x(inf, 'cpu_speedup_vs_torch', n)} |")
    if "spread_pct" in tr:
        lines += ["", f"Rounds: {result['rounds']}; spread of the round medians, (max - min) / median:"]
        for mode, r in (("training step", tr), ("inference", inf)):
            spread = ", ".join(f"{n} {v:.0f}%" for n, v in r["spread_pct"].items())
            sp = "; ".join(f"{n} x torch per round " + " / ".join(f"{v:.2f}" for v in vs)
                           for n, vs in r["speedup_rounds"].items())
            lines.append(f"* {mode}: {spread}; {sp}")
    k = result["correctness"]
    lines += ["", f"Correctness first (valid positions): training forward {k['train_forward']:.1e}, "
                  f"input gradient (relative) {k['input_grad']:.1e}, inference {k['inference']:.1e} "
                  f"(bound {result['tolerance']:g})."]
    if "profile" in result:
        from .step_profile import markdown as profile_markdown

        lines += ["", profile_markdown(result["profile"])]
    return "\n".join(lines)
