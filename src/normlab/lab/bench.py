"""Benchmark harness: normlab's norms against torch's, same run, same inputs.

Method (docs/performance.md): inputs are leaf tensors created once; each
repeat runs normlab, torch and a memory copy back to back (interleaved, the
order rotating), with ``.grad`` reset to None between repeats as in a training
step; the median over repeats after warm-up is reported. Achieved bandwidth
is bytes that must move / time, compared with the copy measured in the same
repeats: ``floor %`` = (bytes / copy speed) / time.
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as TF

from .. import functional as F
from ..kernels import build, fused
from ..kernels import cpu as cpu_kernels

OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
SHAPES = ((8192, 768), (32768, 768), (4096, 4096), (65536, 80), (16384, 256))
DTYPES = ("float32", "bfloat16", "float16")
#: tensors of the input's size that must cross memory: (forward, forward+backward)
TENSORS_MOVED = {
    "layer_norm": (2, 5),  # fwd: read x, write y; bwd: read dy, x, write dx
    "rms_norm": (2, 5),
    "add_layer_norm": (4, 9),  # fwd: read x, r, write y, s; bwd: read dy, ds, s, write dx and dr (two .grads)
    "add_rms_norm": (4, 9),
}


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    mode: str  # "fwd" or "fwd+bwd"
    normlab_ms: float
    torch_ms: float
    ratio: float  # torch_ms / normlab_ms: > 1 means normlab is faster
    gbps: float  # achieved by normlab
    floor_pct: float  # memory-bound floor time / normlab time, in percent
    saved_mb_normlab: float | None = None  # bytes kept for backward (fwd+bwd rows)
    saved_mb_torch: float | None = None
    copy_gbps: float | None = None  # the memory copy timed in the same repeats (the floor's yardstick)
    faults_normlab: int | None = None  # minor page faults of one step: fresh pages the allocator had to map
    faults_torch: int | None = None


def _calls(op: str, x, r, w, b) -> tuple[Callable, Callable]:
    """(normlab, torch) callables returning the outputs to differentiate."""
    d = x.shape[-1]
    if op == "layer_norm":
        return (lambda: (F.layer_norm(x, d, w, b),), lambda: (TF.layer_norm(x, [d], w, b),))
    if op == "rms_norm":
        return (lambda: (F.rms_norm(x, d, w),), lambda: (TF.rms_norm(x, [d], w),))
    if op == "add_layer_norm":

        def eager_ln():
            s = x + r
            return TF.layer_norm(s, [d], w, b), s

        return (lambda: F.add_layer_norm(x, r, d, w, b), eager_ln)

    def eager_rms():
        s = x + r
        return TF.rms_norm(s, [d], w), s

    return (lambda: F.add_rms_norm(x, r, d, w), eager_rms)


def _step(fn: Callable, seeds, leaves, backward: bool) -> None:
    for t in leaves:
        t.grad = None
    if not backward:
        with torch.no_grad():
            fn()
        return
    outs = fn()
    torch.autograd.backward(outs, seeds[: len(outs)])


def _interleaved_ms(fns: list[Callable], repeats: int, warmup: int, flush: Callable | None = None) -> list[float]:
    """Median ms of each callable, run in turn every repeat, the order rotating (A/B/C interleaved).

    With ``flush`` (a copy far larger than the cache), it runs before every timed call and is timed too (its
    median is the last value returned): each callable then starts from the same cold cache, whatever ran
    before it. Without it, a callable that follows another on the same inputs finds some of them in cache."""
    for _ in range(warmup):
        for fn in fns:
            if flush:
                flush()
            fn()
    times: list[list[float]] = [[] for _ in range(len(fns) + bool(flush))]
    for i in range(repeats):
        for k in range(len(fns)):
            j = (k + i) % len(fns)
            if flush:
                t0 = time.perf_counter()
                flush()
                times[-1].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fns[j]()
            times[j].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def _ab_median(a: Callable, b: Callable, repeats: int, warmup: int, flush: Callable | None = None
               ) -> tuple[float, float]:
    ta, tb, *_ = _interleaved_ms([a, b], repeats, warmup, flush)
    return ta, tb


class _Copy:
    """A copy into a reused buffer far larger than cache: the floor's yardstick, timed beside each case."""

    def __init__(self, nbytes: int = 128 << 20):
        self.src = torch.ones(nbytes // 4)
        self.dst = torch.empty_like(self.src)
        self.nbytes = nbytes

    def __call__(self) -> None:
        self.dst.copy_(self.src)

    def gbps(self, ms: float) -> float:
        return 2 * self.nbytes / (ms / 1e3) / 1e9


def copy_gbps(nbytes: int = 256 << 20, repeats: int = 15) -> float:
    """Memory-copy speed (read + write bytes per second) of a buffer far larger than cache."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(ts) / 1e9


def page_faults(fn: Callable) -> int:
    """Minor page faults during one call of ``fn``: pages of new outputs the allocator had to map afresh
    (glibc returns blocks above its mmap threshold, at most 32 MB, to the OS on free, so every such output is
    faulted in again, a few microseconds per 4 KB page)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def saved_bytes(fn: Callable) -> int:
    """Bytes of distinct tensors autograd keeps between forward and backward."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _sig(v: float, digits: int = 4) -> float:
    """``v`` to ``digits`` significant digits (the JSON keeps what the table shows, and tiny values stay > 0)."""
    return float(f"{v:.{digits}g}")


def bench_one(op, shape, dtype, *, copy_speed=None, repeats=15, warmup=3) -> list[Row]:
    """fwd and fwd+bwd rows of one case. ``copy_speed=None``: a memory copy is timed interleaved with
    normlab and torch in the same repeats (on a shared machine the floor moves with the load)."""
    n, d = shape
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).to(dt).requires_grad_()
    r = torch.randn(n, d, generator=g).to(dt).requires_grad_() if op.startswith("add_") else None
    w = torch.randn(d, generator=g).to(dt).requires_grad_()
    b = torch.randn(d, generator=g).to(dt).requires_grad_() if "layer" in op else None
    seeds = [torch.randn(n, d, generator=g).to(dt) for _ in range(2)]
    leaves = [t for t in (x, r, w, b) if t is not None]
    ours, theirs = _calls(op, x, r, w, b)
    rows = []
    copy = _Copy() if copy_speed is None else None
    for mode, backward, k in (("fwd", False, 0), ("fwd+bwd", True, 1)):
        fns = [lambda bw=backward: _step(ours, seeds, leaves, bw), lambda bw=backward: _step(theirs, seeds, leaves, bw)]
        a_ms, b_ms, *c_ms = _interleaved_ms(fns, repeats, warmup, flush=copy)
        speed = copy.gbps(c_ms[0]) if copy else copy_speed
        nbytes = TENSORS_MOVED[op][k] * n * d * x.element_size()
        floor_ms = nbytes / (speed * 1e9) * 1e3
        row = Row(op, f"{n}x{d}", dtype, mode, _sig(a_ms), _sig(b_ms), _sig(b_ms / a_ms),
                  _sig(nbytes / a_ms / 1e6), _sig(100 * floor_ms / a_ms), copy_gbps=_sig(speed, 3),
                  faults_normlab=page_faults(fns[0]), faults_torch=page_faults(fns[1]))
        if backward:
            row.saved_mb_normlab = round(saved_bytes(ours) / 2**20, 1)
            row.saved_mb_torch = round(saved_bytes(theirs) / 2**20, 1)
        rows.append(row)
    return rows


def cold_start_seconds() -> float:
    """Seconds for the first rms_norm forward+backward in a fresh process with empty build caches."""
    import tempfile

    code = (
        "import time, torch; t=time.perf_counter(); import normlab;"
        "x=torch.randn(64,64,requires_grad=True); normlab.functional.rms_norm(x,64).sum().backward();"
        "print(time.perf_counter()-t)"
    )
    with tempfile.TemporaryDirectory() as tmp:  # empty caches: inductor's and normlab's C++ build
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tmp, NORMLAB_CACHE_DIR=tmp)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:  # the fresh process's own error, in one line (a traceback hid it, "a bug in normlab")
        from .._checks import Unavailable

        said = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        raise Unavailable(f"the cold start's fresh process failed (exit {out.returncode}: "
                          f"{said[-1][:200] if said else 'no message'}); run without --cold-start")
    return float(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "load": [round(v, 2) for v in os.getloadavg()],
            "torch_isa": torch.backends.cpu.get_cpu_capability(),
            "kernel_flags": " ".join(build.flags()) if cpu_kernels.available() else None}  # None: not run


def kernels_note(m: dict) -> str:
    """The header's note of which instruction sets ran (``machine()``'s record): torch's, normlab's build."""
    if not m.get("torch_isa"):
        return ""
    if m.get("kernel_flags") is None and "kernel_flags" in m:
        return f"; torch's CPU kernels for {m['torch_isa']}, normlab's C++ kernels unavailable (its fallbacks ran)"
    return f"; torch's CPU kernels for {m['torch_isa']}, normlab's compiled with `{m['kernel_flags']}`"


def torch_vs_itself(shape=(8192, 768), repeats: int = 15, warmup: int = 3) -> float:
    """torch's LayerNorm fwd+bwd timed A/B against itself: how far from 1.00x noise alone moves a ratio."""
    n, d = shape
    x = torch.randn(n, d, requires_grad=True)
    w, b = torch.randn(d, requires_grad=True), torch.randn(d, requires_grad=True)
    seeds = [torch.randn(n, d)]
    fn = lambda: (TF.layer_norm(x, [d], w, b),)  # noqa: E731
    a, c = _ab_median(lambda: _step(fn, seeds, [x, w, b], True), lambda: _step(fn, seeds, [x, w, b], True),
                      repeats, warmup, flush=_Copy())
    return _sig(c / a, 3)


def run(ops=OPS, shapes=SHAPES, dtypes=DTYPES, repeats=15, warmup=3, progress: Callable | None = None) -> dict:
    """Run the grid; returns ``{"machine", "copy_gbps", "torch_vs_itself", "rows", ...}``.

    Each case times a memory copy in its own repeats; ``copy_gbps`` is the median over cases.
    """
    rows: list[Row] = []
    grid = [(o, s, d) for o in ops for s in shapes for d in dtypes]
    start = machine()  # the load before the run
    for i, (op, shape, dtype) in enumerate(grid):
        rows += bench_one(op, shape, dtype, repeats=repeats, warmup=warmup)
        if progress:  # case i is done (counted from 0, as every progress callback)
            progress(i, len(grid), f"{op} {shape[0]}x{shape[1]} {dtype}")
    # after the cases, in the process state they ran in (first, it measured the heap's layout in a fresh process
    # as much as the machine's noise: 0.66x in one run)
    noise = torch_vs_itself(repeats=repeats, warmup=warmup)
    speed = statistics.median(r.copy_gbps for r in rows) if rows else copy_gbps()
    return {"machine": start, "copy_gbps": round(speed, 1), "torch_vs_itself": noise, "repeats": repeats,
            "warmup": warmup, "compile_first_call_s": dict(fused.COLD_START_S), "rows": [asdict(r) for r in rows]}


def timing_note(result: dict) -> str:
    """How each median of ``result`` (the CPU table's or the GPU section's) was taken, as a sentence; nothing for
    a result saved before it recorded that."""
    if "repeats" not in result:
        return ""
    return f" Medians of {result['repeats']} timed repeats per case after {result['warmup']} warm-ups."


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['threads']} threads, torch {m['torch']}, Python {m['python']}"
        + (f", load average {m['load'][0]:g} at the start" if m.get("load") else "")
        + kernels_note(m) + "; "
        f"memory copy {result['copy_gbps']} GB/s (read + write; median over cases, each timed in its own "
        "repeats)" + (f"; torch's LayerNorm timed against itself (8192x768): {result['torch_vs_itself']:.2f}x"
                      if result.get("torch_vs_itself") else "") + "."
        + timing_note(result),
        "",
        "| op | shape | dtype | mode | normlab ms | torch ms | ratio | GB/s | copy GB/s | % of floor "
        "| saved MB (normlab / torch) | page faults per step (normlab / torch) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["rows"]:
        saved = "" if r["saved_mb_normlab"] is None else f"{r['saved_mb_normlab']} / {r['saved_mb_torch']}"
        copy = r.get("copy_gbps") or result["copy_gbps"]
        faults = "" if r.get("faults_normlab") is None else f"{r['faults_normlab']} / {r['faults_torch']}"
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['mode']} | {r['normlab_ms']:.3f} | {r['torch_ms']:.3f} "
            f"| {r['ratio']:.2f}x | {r['gbps']:.1f} | {copy:.1f} | {r['floor_pct']:.0f}% | {saved} | {faults} |"
        )
    if result.get("cold_start_s") is not None:
        lines += ["", "Cold start (fresh process, empty build caches, rms_norm fwd+bwd): "
                  f"{result['cold_start_s']:.1f} s"]
    return "\n".join(lines)
