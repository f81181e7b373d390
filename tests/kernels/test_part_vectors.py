"""A row's last elements (``D`` not a multiple of the vector) go through part vectors: never a read or a write
beyond the row. Every tensor of a kernel call ends where an inaccessible page begins, so a load or store of a
whole vector at a row's end faults (a child process: the fault must not take the test run with it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from normlab.kernels import build, cpu

CHILD = r"""
import ctypes, mmap, sys, torch
from normlab.kernels import cpu

libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PAGE, keep = mmap.PAGESIZE, []


def fenced(t):
    # a copy of t that ends where a page without access begins
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // PAGE)
    m = mmap.mmap(-1, (pages + 1) * PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(addr + pages * PAGE, PAGE, 0) == 0, ctypes.get_errno()
    out = torch.frombuffer(m, dtype=t.dtype, count=t.numel(), offset=pages * PAGE - nbytes).view(t.shape)
    out.copy_(t)
    keep.append(m)
    return out


P = lambda t: None if t is None else t.data_ptr()
g = torch.Generator().manual_seed(0)
lib = cpu.library()
for dt in sorted(cpu.dtypes(), key=str):
    ad = torch.float64 if dt == torch.float64 else torch.float32
    for d in (1, 5, 31, 75, 77, 250):
        for rms in (False, True):
            n = 3
            x, r, dy, ds = (fenced(torch.randn(n, d, generator=g).to(dt)) for _ in range(4))
            w, b = (fenced(torch.randn(d, generator=g).to(ad)) for _ in range(2))
            b = None if rms else b
            y, s, dx, dx2 = (fenced(torch.zeros(n, d, dtype=dt)) for _ in range(4))
            mean, rstd = None if rms else fenced(torch.zeros(n, dtype=ad)), fenced(torch.zeros(n, dtype=ad))
            dw, db = fenced(torch.zeros(d, dtype=ad)), None if rms else fenced(torch.zeros(d, dtype=ad))
            rows = lib.normlab_rows_per_partial()
            partial = fenced(torch.zeros((n + rows - 1) // rows, 2, d, dtype=ad))
            suf = cpu._SUFFIX[dt]
            for stream in (0, 1):
                getattr(lib, f"normlab_fwd_{suf}")(P(x), P(r), P(s), P(w), P(b), P(y), P(mean), P(rstd), n, d, 1e-5,
                                                   int(rms), stream, 1)
                getattr(lib, f"normlab_bwd_{suf}")(P(dy), P(s), P(mean), P(rstd), P(w), P(ds), P(dx), P(dx2), P(dw),
                                                   P(db), P(partial), n, d, int(rms), stream, 1)
            # the values too: the last row against torch's on plain tensors
            want = (x.double() + r.double()).to(dt).double()
            if rms:
                want = want * torch.rsqrt(want.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
            else:
                want = torch.nn.functional.layer_norm(want, (d,), w.double(), b.double(), 1e-5)
            tol = 1e-4 if dt in (torch.float32, torch.float64) else 2e-2
            assert (y.double() - want).abs().max() <= tol * (1 + want.abs().max()), (dt, d, rms)
            assert torch.equal(dx, dx2), (dt, d, rms)
print("ok")
"""


# the build for this CPU (masked loads and stores on AVX-512), and narrower vectors: AVX's masked loads with
# stores through a buffer, and 16-byte vectors with neither (a whole-vector load inside the row's last page)
WIDTHS = ["", "-DNORMLAB_VECTOR_BYTES=16"] + (["-DNORMLAB_VECTOR_BYTES=32"] if " avx2" in build.isa_flags() else [])


@pytest.mark.skipif(not cpu.available(), reason="no C++ compiler")
@pytest.mark.parametrize("flags", WIDTHS, ids=["native", "16-byte", "32-byte"][: len(WIDTHS)])
def test_a_rows_last_part_never_reads_or_writes_beyond_it(flags, tmp_path):
    env = dict(os.environ)
    if flags:  # a build of its own (the native one is the suite's)
        env.update(NORMLAB_CACHE_DIR=str(tmp_path / "cache"), NORMLAB_CXXFLAGS=f"-O1 {flags}")
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert run.stdout.strip().endswith("ok")
