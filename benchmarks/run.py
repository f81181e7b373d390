"""Run the full benchmark grid and write its tables into docs/performance.md.

    .venv/bin/python benchmarks/run.py [--repeats 15] [--shapes 8192x768 ...] [--dtypes float32 ...]

Results also go to benchmarks/results.json. The CPU table replaces the block
between the ``bench:start`` / ``bench:end`` markers in docs/performance.md,
the GPU section the block between ``bench-gpu:start`` / ``bench-gpu:end``
(a one-line "skipped" message where no CUDA device is present), and what
``auto`` chose for each case the block between ``bench-dispatch:start`` /
``bench-dispatch:end``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import torch

from normlab.cli._common import shape
from normlab.lab import bench, bench_dispatch, bench_gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _replace(text: str, tag: str, table: str) -> str:
    block = f"<!-- {tag}:start -->\n{table}\n<!-- {tag}:end -->"
    return re.sub(rf"<!-- {tag}:start -->.*?<!-- {tag}:end -->", lambda _: block, text, flags=re.S)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--shapes", nargs="+", type=shape, default=None, help="NxD (default: the standard set)")
    p.add_argument("--dtypes", nargs="+", default=None, help="default: float32 bfloat16 float16")
    args = p.parse_args()
    grid = {"shapes": args.shapes or bench.SHAPES, "dtypes": args.dtypes or bench.DTYPES}
    torch.set_num_threads(2)

    def progress(i, n, label):
        print(f"[{i + 1}/{n}] {label}", file=sys.stderr, flush=True)

    result = bench.run(repeats=args.repeats, progress=progress, **grid)
    result["cold_start_s"] = bench.cold_start_seconds()
    result["gpu"] = bench_gpu.run(progress=progress)
    result["dispatch"] = bench_dispatch.run(progress=progress, **grid)
    (ROOT / "benchmarks" / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    doc = ROOT / "docs" / "performance.md"
    text = _replace(doc.read_text(), "bench", bench.markdown(result))
    text = _replace(text, "bench-gpu", bench_gpu.markdown(result["gpu"]))
    text = _replace(text, "bench-dispatch", bench_dispatch.markdown(result["dispatch"]))
    doc.write_text(text)
    print(bench.markdown(result))
    print(bench_gpu.markdown(result["gpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
