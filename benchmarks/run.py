"""Run the full benchmark grid and write its table into docs/performance.md.

    .venv/bin/python benchmarks/run.py [--repeats 15]

Results also go to benchmarks/results.json. The table replaces the block
between the ``bench:start`` / ``bench:end`` markers in docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import torch

from normlab.lab import bench

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(2)

    def progress(i, n, label):
        print(f"\r[{i + 1}/{n}] {label:<48s}", end="", file=sys.stderr, flush=True)

    result = bench.run(repeats=args.repeats, progress=progress)
    result["cold_start_s"] = bench.cold_start_seconds()
    print(file=sys.stderr)
    (ROOT / "benchmarks" / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    table = bench.markdown(result)
    doc = ROOT / "docs" / "performance.md"
    text = doc.read_text()
    block = f"<!-- bench:start -->\n{table}\n<!-- bench:end -->"
    text = re.sub(r"<!-- bench:start -->.*?<!-- bench:end -->", lambda _: block, text, flags=re.S)
    doc.write_text(text)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
