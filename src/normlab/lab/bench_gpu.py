"""GPU section of ``normlab bench``: normlab's norms against torch's on a CUDA device, same run.

On CUDA the kernels' compiled path is what inductor turns into Triton. Each
case is timed with CUDA events (median of repeats after warm-up, normlab and
torch interleaved as on the CPU), and compared with a device-to-device copy
measured in the same run: ``% of copy`` = (bytes that must move / copy speed)
/ time, the share of the device's copy bandwidth the kernel reaches. Without
a CUDA device the section is skipped with a message (``{"skipped": reason}``).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from .bench import TENSORS_MOVED, _calls, _sig, _step, timing_note

#: the issue's target case: compiled RMSNorm forward at 8192x4096 bf16 (>= 85% of the copy bandwidth)
GPU_SHAPES = ((8192, 4096), (32768, 768))
GPU_DTYPES = ("bfloat16",)
GPU_OPS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm")


def available() -> str | None:
    """None when a CUDA device can be benchmarked, else the reason it cannot."""
    if not torch.cuda.is_available():
        return "no CUDA device: GPU section skipped"
    return None


def _events_ms(fn: Callable, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def copy_gbps(device, nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device memory copy speed (read + write bytes per second) of a 1 GiB buffer."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    ms = statistics.median(_events_ms(lambda: dst.copy_(src), repeats))
    return 2 * nbytes / (ms / 1e3) / 1e9


def bench_case(op: str, shape, dtype: str, device, copy_speed: float, repeats: int = 50,
               warmup: int = 10) -> list[dict]:
    """fwd and fwd+bwd rows of one case on ``device``."""
    n, d = shape
    dt = getattr(torch, dtype)
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, device=device).to(dt).requires_grad_()  # noqa: E731
    x = mk(n, d)
    r = mk(n, d) if op.startswith("add_") else None
    w = mk(d)
    b = mk(d) if "layer" in op else None
    seeds = [torch.randn(n, d, generator=g, device=device).to(dt) for _ in range(2)]
    leaves = [t for t in (x, r, w, b) if t is not None]
    ours, theirs = _calls(op, x, r, w, b)
    rows = []
    for mode, backward, k in (("fwd", False, 0), ("fwd+bwd", True, 1)):
        a = lambda bw=backward: _step(ours, seeds, leaves, bw)  # noqa: E731
        t = lambda bw=backward: _step(theirs, seeds, leaves, bw)  # noqa: E731
        for _ in range(warmup):
            a()
            t()
        torch.cuda.synchronize(device)
        ta, tt = [], []
        for i in range(repeats):  # interleaved, the order alternating
            pair = ((a, ta), (t, tt)) if i % 2 == 0 else ((t, tt), (a, ta))
            for fn, acc in pair:
                acc += _events_ms(fn, 1)
        a_ms, t_ms = statistics.median(ta), statistics.median(tt)
        nbytes = TENSORS_MOVED[op][k] * n * d * x.element_size()
        floor_ms = nbytes / (copy_speed * 1e9) * 1e3
        rows.append({"op": op, "shape": f"{n}x{d}", "dtype": dtype, "mode": mode, "normlab_ms": _sig(a_ms),
                     "torch_ms": _sig(t_ms), "ratio": _sig(t_ms / a_ms), "gbps": _sig(nbytes / a_ms / 1e6),
                     "copy_pct": _sig(100 * floor_ms / a_ms)})
    return rows


def run(device=None, ops=GPU_OPS, shapes=GPU_SHAPES, dtypes=GPU_DTYPES, repeats: int = 50, warmup: int = 10,
        progress: Callable | None = None) -> dict:
    """The GPU section: ``{"device", "copy_gbps", "repeats", "warmup", "rows"}``, or ``{"skipped": reason}``
    without CUDA."""
    reason = available()
    if reason:
        return {"skipped": reason}
    device = torch.device(device or "cuda")
    speed = copy_gbps(device)
    grid = [(o, s, d) for o in ops for s in shapes for d in dtypes]
    rows = []
    for i, (op, shape, dtype) in enumerate(grid):
        rows += bench_case(op, shape, dtype, device, speed, repeats=repeats, warmup=warmup)
        if progress:  # case i is done (counted from 0)
            progress(i, len(grid), f"gpu {op} {shape[0]}x{shape[1]} {dtype}")
    return {"device": torch.cuda.get_device_name(device), "copy_gbps": round(speed, 1), "repeats": repeats,
            "warmup": warmup, "rows": rows}


def markdown(section: dict) -> str:
    if "skipped" in section:
        return f"GPU: {section['skipped']}."
    lines = [f"GPU: {section['device']}; device copy {section['copy_gbps']} GB/s (read + write) in the same run."
             + timing_note(section), "",
             "| op | shape | dtype | mode | normlab ms | torch ms | ratio | GB/s | % of copy |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in section["rows"]:
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['mode']} | {r['normlab_ms']:.4f} | "
                     f"{r['torch_ms']:.4f} | {r['ratio']:.2f}x | {r['gbps']:.0f} | {r['copy_pct']:.0f}% |")
    return "\n".join(lines)
