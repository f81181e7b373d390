"""How many rows a thread takes at a time: the C++ kernels built with several chunk sizes, timed alone, paired.

Each variant is ``cpu_kernels.cpp`` compiled with the build's flags and ``-DNORMLAB_CHUNK_BYTES=N`` (0: the rule
before, 16 rows in the forward and one 32-row block in the backward; 1048576: the rule). Outputs are allocated once
(no allocator or page faults in the times), every timed call follows a 128 MB copy (cold, as in ``normlab bench``),
the variants rotate, medians over ``--repeats``. Writes benchmarks/row_chunks.json and prints a markdown table of
ms per call and each variant's time over the rule before's (docs/performance.md, "Chunks of rows").

    python benchmarks/row_chunks.py [--repeats 25] [--threads 2] [--chunks 0 65536 262144 1048576 4194304]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch

from normlab.kernels import build, cpu
from normlab.kernels.cpu import _ptr
from normlab.lab.bench import machine

SHAPES = [(8192, 768), (16384, 256), (65536, 80), (32768, 768), (2048, 256), (4096, 80)]
OPS = [("layer_norm", False, False), ("add_layer_norm", False, True), ("rms_norm", True, False),
       ("add_rms_norm", True, True)]


def _library(folder: pathlib.Path, chunk: int) -> ctypes.CDLL:
    out = folder / f"chunks_{chunk}.so"
    subprocess.run([*build.compiler(), *build.flags(), f"-DNORMLAB_CHUNK_BYTES={chunk}", str(build.SOURCE), "-o",
                    str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    cpu.declare(lib)
    return lib


def _case(libs: dict[int, ctypes.CDLL], n: int, d: int, rms: bool, add: bool, threads: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x, r, dy, ds = (torch.randn(n, d, generator=g) for _ in range(4))
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    y, s, dx = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    mean, rstd, dw, db = torch.empty(n), torch.empty(n), torch.empty(d), torch.empty(d)
    rows = next(iter(libs.values())).normlab_rows_per_partial()
    partial = torch.empty((n + rows - 1) // rows, 2, d)
    big, dst = torch.empty(32 << 20), torch.empty(32 << 20)
    r_, s_, ds_, b_, db_ = (r, s, ds, None, None) if add else (None, None, None, None, None)
    if not rms:
        b_, db_ = b, db

    def fwd(lib):
        lib.normlab_fwd_f32(_ptr(x), _ptr(r_), _ptr(s_), _ptr(w), _ptr(b_), _ptr(y), _ptr(mean), _ptr(rstd), n, d,
                            1e-5, int(rms), 1, threads)

    def bwd(lib):
        lib.normlab_bwd_f32(_ptr(dy), _ptr(x), _ptr(mean), _ptr(rstd), _ptr(w), _ptr(ds_), _ptr(dx), None, _ptr(dw),
                            _ptr(db_), _ptr(partial), n, d, int(rms), 1, threads)

    times = {(c, m): [] for c in libs for m in ("fwd", "bwd")}
    names = list(libs)
    for i in range(repeats + 3):
        for c in names[i % len(names):] + names[: i % len(names)]:
            for m, fn in (("fwd", fwd), ("bwd", bwd)):
                dst.copy_(big)
                t0 = time.perf_counter()
                fn(libs[c])
                if i >= 3:
                    times[(c, m)].append(time.perf_counter() - t0)
    return {f"{c}/{m}": round(statistics.median(v) * 1e3, 4) for (c, m), v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 65536, 262144, 1048576, 4194304])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {c: _library(pathlib.Path(tmp), c) for c in args.chunks}
        rows = []
        for n, d in SHAPES:
            for op, rms, add in OPS:
                ms = _case(libs, n, d, rms, add, args.threads, args.repeats)
                rows.append({"op": op, "shape": f"{n}x{d}", "ms": ms})
                print(f"{op} {n}x{d} " + " ".join(f"{k} {v:.3f}" for k, v in ms.items()), flush=True)
    base = args.chunks[0]
    head = "| op | shape | pass | " + " | ".join(f"{c} B ms" for c in args.chunks) + " | " + " | ".join(
        f"{c} / {base}" for c in args.chunks[1:]) + " |"
    print("\n" + head + "\n|" + "---|" * (3 + 2 * len(args.chunks) - 1))
    for row in rows:
        for m in ("fwd", "bwd"):
            t = [row["ms"][f"{c}/{m}"] for c in args.chunks]
            print(f"| {row['op']} | {row['shape']} | {m} | " + " | ".join(f"{v:.3f}" for v in t) + " | "
                  + " | ".join(f"{v / t[0]:.2f}" for v in t[1:]) + " |")
    out = pathlib.Path(__file__).with_name("row_chunks.json")
    out.write_text(json.dumps({"machine": machine(), "cpu_count": os.cpu_count(), "repeats": args.repeats,
                               "chunks": args.chunks, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
