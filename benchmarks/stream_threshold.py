"""The C++ kernels with outputs streamed from the cores' own caches (the rule) against streamed only from the
last-level cache (the rule before), and torch's LayerNorm, timed paired in one process.

Every timed call follows a 128 MB copy (cold, as in ``normlab bench``) or, with ``--warm``, a call of the same
kernel (its inputs and outputs were just touched); the three candidates rotate; medians over ``--repeats``.
Writes benchmarks/stream_threshold.json and prints a markdown table (docs/performance.md).

    python benchmarks/stream_threshold.py [--repeats 31] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import torch

from normlab.kernels import cpu
from normlab.kernels.dispatch import get_kernel

#: LayerNorm at the bench's shapes and a 6 MB one (the other ops allocate more outputs per call: their times here
#: move with the allocator's page faults more than with the stores, as the bench's page-fault column shows)
CASES = [("layer_norm", 8192, 768), ("layer_norm", 16384, 256), ("layer_norm", 65536, 80), ("layer_norm", 2048, 768),
         ("layer_norm", 1024, 768)]


def _time_case(op: str, n: int, d: int, train: bool, warm: bool, repeats: int) -> dict:
    rms, add = "rms" in op, op.startswith("add")
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    r = torch.randn(n, d, generator=g) if add else None
    w, b = torch.randn(d, generator=g), None if rms else torch.randn(d, generator=g)
    big, dst = torch.empty(32 << 20), torch.empty(32 << 20)
    rule = cpu.stream_bytes()
    cands = {"own caches": (get_kernel("cpu"), rule), "last level": (get_kernel("cpu"), cpu.last_level_cache_bytes())}
    if not rms and not add:
        cands["torch"] = (get_kernel("native"), rule)

    def step(kernel):
        y, s, mean, rstd = kernel.fwd(x, r, w, b, 1e-5, rms=rms, s_dtype=x.dtype)
        if train:
            kernel.bwd(dy, x if s is None else s, mean, rstd, w, dy if add else None, rms=rms)

    times = {k: [] for k in cands}
    saved = cpu.stream_bytes
    try:
        for i in range(repeats + 2):
            names = list(cands)[i % len(cands):] + list(cands)[: i % len(cands)]
            for name in names:
                kernel, threshold = cands[name]
                cpu.stream_bytes = lambda threads=None, t=threshold: t  # noqa: E731
                step(kernel) if warm else dst.copy_(big)
                t0 = time.perf_counter()
                step(kernel)
                if i >= 2:  # two warm-up rounds
                    times[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        cpu.stream_bytes = saved
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).with_name("stream_threshold.json")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for warm in (False, True):
        for op, n, d in CASES:
            for train in (False, True):
                ms = _time_case(op, n, d, train, warm, args.repeats)
                rows.append({"op": op, "shape": f"{n}x{d}", "mode": "fwd+bwd" if train else "fwd",
                             "start": "warm" if warm else "cold", "MB": round(n * d * 4 / 2**20, 1), "ms": ms})
    result = {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              "threads": args.threads, "stream_bytes": cpu.stream_bytes(),
              "last_level_cache_bytes": cpu.last_level_cache_bytes(), "torch": torch.__version__,
              "load_average": os.getloadavg()[0], "rows": rows}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"streamed from {cpu.stream_bytes() >> 20} MiB (the cores' own caches) against "
          f"{cpu.last_level_cache_bytes() >> 20} MiB (the last-level cache); {args.threads} threads, "
          f"median of {args.repeats}\n")
    print("| op | shape | output MB | mode | start | own caches ms | last level ms | torch ms | own / last level |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    for row in rows:
        ms = row["ms"]
        torch_ms = f"{ms['torch']:.3f}" if "torch" in ms else ""
        print(f"| {row['op']} | {row['shape']} | {row['MB']} | {row['mode']} | {row['start']} | "
              f"{ms['own caches']:.3f} | {ms['last level']:.3f} | {torch_ms} | "
              f"{ms['own caches'] / ms['last level']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
