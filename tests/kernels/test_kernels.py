"""Kernel dispatch, the kernels' own properties, and composability with torch.compile."""
from __future__ import annotations

import ctypes
import mmap
import pathlib
import threading
import warnings

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import normlab
from conftest import skip_unsupported
from normlab import functional as F
from normlab import kernels
from normlab.kernels import autotune, cpu, fused
from normlab.kernels.native import NativeKernel

HAS_CPU = cpu.available()
HALF = (torch.float16, torch.bfloat16)


@pytest.fixture
def fixed_table(monkeypatch):
    """``auto`` without measuring: the fixed table these tests pin down."""
    monkeypatch.setattr(autotune, "_enabled", False)


def test_auto_policy(fixed_table):
    """On CPU: normlab's C++ kernels for every dtype, except plain LayerNorm rows narrower than
    NATIVE_BELOW_D in float32/float64 (torch's kernel measured faster there); without a compiler,
    torch's LayerNorm kernel (float32/float64), else the compiled path."""
    half = "compiled" if fused.available() else "reference"
    for d in (8, 768):
        x32, x64, xbf = torch.randn(4, d), torch.randn(4, d).double(), torch.randn(4, d).bfloat16()
        for op in kernels.OPS:
            full = "cpu" if HAS_CPU else ("native" if "layer" in op else half)
            if op == "layer_norm" and d < kernels.NATIVE_BELOW_D:
                full = "native"
            assert kernels.resolve("auto", op, x32, 1e-5) == full, (op, d)
            assert kernels.resolve("auto", op, x64, 1e-5) == full, (op, d)
            assert kernels.resolve("auto", op, xbf, 1e-5) == ("cpu" if HAS_CPU else half), (op, d)
            assert kernels.resolve("auto", op, x32, 0.0) != "native"  # torch gives NaN on constant rows at eps = 0
    # the row length is prod(normalized_shape), not the last dim
    expected = "cpu" if HAS_CPU else "native"
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 30, 30), 1e-5, d=900) == expected


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler: both sides of the boundary are native")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_below_d_boundary_is_exact(dtype, fixed_table):
    """Rows of exactly NATIVE_BELOW_D go to normlab's kernel; one element fewer, to torch's."""
    d = kernels.NATIVE_BELOW_D
    assert kernels.resolve("auto", "layer_norm", torch.randn(2, d - 1, dtype=dtype), 1e-5) == "native"
    assert kernels.resolve("auto", "layer_norm", torch.randn(2, d, dtype=dtype), 1e-5) == "cpu"
    x = torch.randn(2, 8, d // 8, dtype=dtype)  # the row length is prod(normalized_shape)
    assert kernels.resolve("auto", "layer_norm", x, 1e-5, d=d) == "cpu"
    assert kernels.resolve("auto", "layer_norm", x, 1e-5, d=d - 1) == "native"


def test_forced_impl_that_cannot_run_raises():
    with pytest.raises(ValueError, match="native.*rms_norm"):
        F.rms_norm(torch.randn(2, 8), 8, impl="native")
    with pytest.raises(ValueError, match="native"):
        F.layer_norm(torch.randn(2, 8).half(), 8, impl="native")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="cpu"):
            F.rms_norm(torch.randn(2, 8, device="cuda"), 8, impl="cpu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_native_refuses_half_and_auto_gives_constant_rows_their_bias(dtype):
    """torch's half LayerNorm returns half statistics and computes x * rstd - mean * rstd: a constant bfloat16
    row of 30000 (D = 1) came out 0.44 off the bias, and ``auto`` timed it as a candidate for forward-only
    calls. It is refused in every grad mode; ``auto``'s forward-only calls give the bias exactly."""
    x = torch.randn(4, 96, dtype=dtype)
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with mode(), pytest.raises(ValueError, match="native"):
            F.layer_norm(x, 96, impl="native")
    for d, value in ((1, 30000.0), (1, 60000.0), (64, 60000.0), (64, 1000.0)):
        rows = torch.full((8, d), value, dtype=dtype)
        bias = torch.randn(d).to(dtype)
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                assert torch.equal(F.layer_norm(rows, d, None, bias), bias.expand(8, d)), (d, value)
                y, _ = F.add_layer_norm(rows, torch.zeros_like(rows), d, None, bias)
                assert torch.equal(y, bias.expand(8, d)), (d, value)


@pytest.mark.parametrize("impl", ["auto", *(n for n in ("cpu", "native", "reference") if n in kernels.IMPLS)])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_an_input_made_under_inference_mode_trains_a_norm_after(op, impl):
    """Features made under inference_mode (a frozen front end), then a trainable norm on them: autograd refused
    to save the inference tensor, where torch's own RMSNorm trains; the weight's gradient is the same as on a
    normal copy of the input."""
    if impl == "native" and op == "rms_norm":
        pytest.skip("torch's kernel pair has no RMSNorm")
    with torch.inference_mode():
        x = torch.randn(6, 96)
    w = torch.randn(96, requires_grad=True)
    fn = getattr(F, op)
    fn(x, 96, w, impl=impl).square().sum().backward()
    got, w.grad = w.grad, None
    fn(x.clone(), 96, w, impl=impl).square().sum().backward()
    assert torch.equal(got, w.grad)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_native_runs_under_torchs_own_autograd_node_with_the_kernel_pairs_bits(op):
    """``native`` is torch's kernel pair called as torch calls it (its C++ autograd node, the caller's shapes):
    no normlab Function around it, and the same bits as NativeKernel.fwd/bwd (what autotune times)."""
    torch.manual_seed(0)
    x0, r0, w0, b0 = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(4, 8), torch.randn(4, 8)
    x, r, w, b = (t.clone().requires_grad_() for t in (x0, r0, w0, b0))
    if op == "layer_norm":
        y = F.layer_norm(x, (4, 8), w, b, impl="native")
        out = y
    else:
        y, s = F.add_layer_norm(x, r, (4, 8), w, b, impl="native")
        out = y + 0.5 * s  # a gradient reaches s directly too
    assert type(y.grad_fn).__name__ == "NativeLayerNormBackward0" and y.shape == x.shape
    dy = torch.randn_like(x0)
    out.backward(dy)

    k = NativeKernel()  # the kernel pair by hand, on N, D rows
    xr, rr = x0.reshape(-1, 32), None if op == "layer_norm" else r0.reshape(-1, 32)
    y_k, s_k, mean, rstd = k.fwd(xr, rr, w0.reshape(32), b0.reshape(32), 1e-5, rms=False)
    ds = None if op == "layer_norm" else 0.5 * dy.reshape(-1, 32)
    dx, dw, db = k.bwd(dy.reshape(-1, 32), xr if s_k is None else s_k, mean, rstd, w0.reshape(32), ds, rms=False)
    assert torch.equal(y, y_k.reshape(y.shape)) and torch.equal(x.grad, dx.reshape(x.shape))
    assert torch.equal(w.grad, dw.reshape(4, 8)) and torch.equal(b.grad, db.reshape(4, 8))
    if op == "add_layer_norm":
        assert torch.equal(s, s_k.reshape(s.shape)) and torch.equal(r.grad, x.grad)


def test_use_compiled_is_local_to_the_block_and_thread(monkeypatch):
    x = torch.randn(4, 8).bfloat16()
    if not fused.available():
        pytest.skip("no compiler")
    monkeypatch.setattr(cpu.CpuKernel, "supports", lambda *a: False)  # as on a machine without g++
    seen = {}

    def other_thread():
        seen["other"] = kernels.resolve("auto", "rms_norm", x, 1e-5)

    with kernels.use_compiled(False):
        assert kernels.resolve("auto", "rms_norm", x, 1e-5) == "reference"
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen["other"] == "compiled"
    assert kernels.resolve("auto", "rms_norm", x, 1e-5) == "compiled"


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_compiled_leaves_torch_configuration_alone():
    """Many variants (dtypes, with/without weight, eps) compile without touching dynamo's global limits."""
    import torch._dynamo

    before = dict(torch._dynamo.config.get_config_copy())
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for eps in (1e-5, 1e-6):
            x = torch.randn(3, 5, dtype=dtype)
            F.rms_norm(x, 5, eps=eps, impl="compiled")
            F.rms_norm(x, 5, torch.ones(5, dtype=dtype), eps=eps, impl="compiled")
    assert dict(torch._dynamo.config.get_config_copy()) == before
    assert any(k.startswith("rms_fwd/float64/cpu") for k in fused.COLD_START_S)


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_compiled_survives_every_calling_context():
    """One op, one dtype, called with and without autograd, under inference_mode, on one row and on many, on
    a 1-wide and a wide row: each is a variant dynamo would recompile for (12 here, past its limit of 8,
    which fullgraph turns into an error), so each gets its own compiled function."""
    for ctx in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        for n in (1, 6):
            for d in (1, 24):
                with ctx():
                    x = torch.randn(n, d, dtype=torch.float64)
                    y = F.rms_norm(x, d, torch.ones(d, dtype=torch.float64), eps=1e-6, impl="compiled")
                assert y.shape == (n, d) and torch.isfinite(y).all()


def test_col_sum_is_blocked_and_exact_in_float64():
    t = torch.randn(fused.ROW_BLOCK * 3 + 5, 7, dtype=torch.float64)
    torch.testing.assert_close(fused._col_sum(t), t.sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("op", kernels.OPS)
def test_cpu_weight_gradients_do_not_depend_on_thread_count(op):
    """The partial rows come from a fixed block partition, so 1 and 2 threads give the same bits."""
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(1000, 96, generator=g, requires_grad=True) for _ in range(2))
    w, b = torch.randn(96, requires_grad=True), torch.randn(96, requires_grad=True)
    dy = torch.randn(1000, 96, generator=g)

    def run():
        if op == "layer_norm":
            y = F.layer_norm(x, 96, w, b, impl="cpu")
        elif op == "rms_norm":
            y = F.rms_norm(x, 96, w, impl="cpu")
        else:
            y = getattr(F, op)(x, r, 96, w, *([b] if "layer" in op else []), impl="cpu")[0]
        return torch.autograd.grad(y, [w, b] if "layer" in op else [w], dy)

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        two = run()
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, c) for a, c in zip(one, two))


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", sorted(cpu.dtypes(), key=str))
@pytest.mark.parametrize("d", [768, 77, 1])
def test_streamed_stores_give_the_same_bits(dtype, d, monkeypatch):
    """Outputs larger than the cores' own caches are streamed (``cpu.stream_bytes``); forced on for small ones,
    the forward and backward of every op give the bits of ordinary stores, on rows that start at any
    alignment (a view one element into its storage, rows of odd width)."""
    g = torch.Generator().manual_seed(1)
    k = cpu.CpuKernel()
    base = torch.randn(67 * d + 1, generator=g).to(dtype)
    x = base[1:].view(67, d)  # 4 bytes (2 for half types) past the allocation's alignment
    r, dy = (torch.randn(67, d, generator=g).to(dtype) for _ in range(2))
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)

    def run():
        out = []
        for rms in (False, True):
            for res in (None, r):
                y, s, mean, rstd = k.fwd(x, res, w, None if rms else b, 1e-5, rms=rms)
                out += [y, s, mean, rstd, *k.bwd(dy, x if s is None else s, mean, rstd, w, r, rms=rms)]
                if s is not None:
                    out += k.bwd_pair(dy, s, mean, rstd, w, r, rms=rms)
        return out

    monkeypatch.setattr(cpu, "stream_bytes", lambda: 1 << 60)
    plain = run()
    monkeypatch.setattr(cpu, "stream_bytes", lambda: 0)
    assert cpu.streamed(x)
    streamed = run()
    assert all((a is None and c is None) or torch.equal(a, c) for a, c in zip(plain, streamed))


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_add_ops_write_both_input_gradients_in_the_kernels_pass(op, dtype):
    """x and the residual get the same gradient; each ``.grad`` must be a tensor of its own, and autograd copies
    a gradient it is given twice. The kernel writes the second tensor in its own pass: no copy runs in the
    backward, the two are distinct and equal, and they are the bits of the one-output backward."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(300, 96, generator=g).to(dtype).requires_grad_() for _ in range(2))
    w = torch.randn(96, generator=g).requires_grad_()
    b = None if "rms" in op else torch.randn(96, generator=g).requires_grad_()
    dy, ds = (torch.randn(300, 96, generator=g).to(dtype) for _ in range(2))
    args = (x, r, 96, w) if b is None else (x, r, 96, w, b)
    y, s = getattr(F, op)(*args, eps=1e-5, impl="cpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.autograd.backward((y, s), (dy, ds))
    copies = [e.name for e in prof.events() if e.name in ("aten::copy_", "aten::clone")]
    assert not copies, copies
    assert x.grad.data_ptr() != r.grad.data_ptr() and torch.equal(x.grad, r.grad)
    k = cpu.CpuKernel()
    _, s2, mean, rstd = k.fwd(x.detach(), r.detach(), w.detach(), None if b is None else b.detach(), 1e-5,
                              rms=b is None)
    assert torch.equal(k.bwd(dy, s2, mean, rstd, w.detach(), ds, rms=b is None)[0], x.grad)


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
def test_second_gradient_aligned_unlike_the_first_gets_the_same_bits(monkeypatch):
    """Streamed stores need aligned targets: the backward streams its second output only where it is aligned
    like the first. Outputs alternately one element past their allocation's alignment, streaming forced on:
    the bits of aligned outputs and ordinary stores, and no fault."""
    g = torch.Generator().manual_seed(5)
    k = cpu.CpuKernel()
    x, r, dy, ds = (torch.randn(67, 768, generator=g) for _ in range(4))
    w = torch.randn(768, generator=g)
    _, s, _, rstd = k.fwd(x, r, w, None, 1e-5, rms=True)
    monkeypatch.setattr(cpu, "stream_bytes", lambda: 1 << 60)
    plain = k.bwd_pair(dy, s, None, rstd, w, ds, rms=True)
    calls = []

    def shifted(like):
        calls.append(len(calls) % 2)
        return torch.empty(like.numel() + 1, dtype=like.dtype)[calls[-1]:][: like.numel()].view_as(like)

    monkeypatch.setattr(cpu, "_output", shifted)
    monkeypatch.setattr(cpu, "stream_bytes", lambda: 0)
    odd = k.bwd_pair(dy, s, None, rstd, w, ds, rms=True)
    assert (odd[0].data_ptr() - odd[1].data_ptr()) % 64 != 0
    assert all(torch.equal(a, c) for a, c in zip(plain[:3], odd[:3]))


def _vm_flags(addr: int) -> set[str]:
    """The kernel's flags for the mapping holding ``addr`` (``/proc/self/smaps``; ``hg``: huge pages advised)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    return set()


THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_large_outputs_ask_for_huge_pages_small_ones_do_not(monkeypatch):
    """Fresh outputs above glibc's mmap threshold fault in 4 KB at a time inside the kernel's loop (25k faults
    for a 100 MB output); marked for huge pages first they fault in 2 MB at a time. Outputs from 4 MB are marked
    where their memory is fresh (glibc trimmed and mapped it anew); memory already faulted in is left alone, and
    a small output is never advised (its memory may still sit in a mapping an earlier large one advised: the
    flags tell history, so the smaller cases are checked on the call itself)."""
    big = cpu._output(torch.empty(4096, 4096))  # 64 MB
    assert "hg" in _vm_flags(-(-big.data_ptr() // cpu._HUGE) * cpu._HUGE)  # its first 2 MB-aligned page
    calls = []
    monkeypatch.setattr(cpu, "_madvise", lambda: lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(cpu, "_resident", lambda addr: False)  # every page fresh
    cpu._output(torch.empty(64, 64))
    cpu._output(torch.empty(cpu.FRESH_HUGE_MIN // 4 - 1))
    assert calls == []
    cpu._output(torch.empty(cpu.FRESH_HUGE_MIN // 4))
    assert len(calls) == 1
    monkeypatch.setattr(cpu, "_resident", lambda addr: True)  # already in memory: below 32 MB, no advice
    cpu._output(torch.empty(cpu.HUGE_PAGES_MIN // 4 - 1))
    assert len(calls) == 1
    cpu._output(torch.empty(cpu.HUGE_PAGES_MIN // 4))
    assert len(calls) == 2


@pytest.mark.skipif(cpu._libc() is None, reason="no libc mincore here")
def test_resident_tells_fresh_pages_from_touched_ones():
    """mincore on an anonymous mapping: a page never written is not in memory; written, it is."""
    m = mmap.mmap(-1, 2 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert not cpu._resident(addr)
    m[0] = 1
    assert cpu._resident(addr) and not cpu._resident(addr + mmap.PAGESIZE)


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", sorted(cpu.dtypes() - {torch.float32, torch.float64}, key=str))
@pytest.mark.parametrize("d", [4096, 4097])  # half rows up to 4096 are widened once into a buffer, wider ones not
def test_half_rows_either_side_of_the_widening_buffer(dtype, d):
    """Both forward paths of a half-precision row give y rounded once from float32 statistics: against float64,
    within half an ulp of the storage type plus float32 rounding, and the same bits alone or in a batch."""
    g = torch.Generator().manual_seed(2)
    k = cpu.CpuKernel()
    x = (3 * torch.randn(9, d, generator=g) + 1).to(dtype)
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    for rms in (False, True):
        y, _, mean, rstd = k.fwd(x, None, w, None if rms else b, 1e-5, rms=rms)
        xd = x.double()
        mu = 0 if rms else xd.mean(1, keepdim=True)
        ref = (xd - mu) * torch.rsqrt(((xd - mu) ** 2).mean(1, keepdim=True) + 1e-5) * w.double()
        ref = ref if rms else ref + b.double()
        ulp = torch.finfo(dtype).eps * ref.abs().clamp_min(torch.finfo(dtype).tiny)
        assert ((y.double() - ref).abs() <= 0.5 * ulp + 1e-5 * ref.abs().max()).all()
        alone = k.fwd(x[4:5].clone(), None, w, None if rms else b, 1e-5, rms=rms)[0]
        assert torch.equal(alone, y[4:5])


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", sorted(cpu.dtypes() - {torch.float32, torch.float64}, key=str))
@pytest.mark.parametrize("d", [75, 4096, 4097])
def test_half_rows_are_the_float32_kernels_rounded_once(dtype, d):
    """Widening is exact and the arithmetic is float32's: a half-precision call's y and dx are bitwise the float32
    kernel's on the widened inputs, rounded once by torch, and its statistics and dw, db the float32 kernel's;
    forward and backward, either side of the widening buffer, with a vector tail at D = 75."""
    g = torch.Generator().manual_seed(3)
    k = cpu.CpuKernel()
    x, dy = (3 * torch.randn(2, 9, d, generator=g) + 1).to(dtype)
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    for rms in (False, True):
        bb = None if rms else b
        half = k.fwd(x, None, w, bb, 1e-5, rms=rms)
        full = k.fwd(x.float(), None, w, bb, 1e-5, rms=rms)
        assert torch.equal(half[0], full[0].to(dtype)) and torch.equal(half[3], full[3])
        dh = k.bwd(dy, x, half[2], half[3], w, None, rms=rms)
        df = k.bwd(dy.float(), x.float(), full[2], full[3], w, None, rms=rms)
        assert torch.equal(dh[0], df[0].to(dtype)) and torch.equal(dh[1], df[1])
        assert rms or torch.equal(dh[2], df[2])


def test_stream_threshold_is_the_cores_own_caches_or_the_environment(monkeypatch):
    """Outputs are streamed from the size of the cores' own caches (threads x the largest cache below the last
    level), or the last-level cache where that is smaller; ``NORMLAB_STREAM_BYTES`` overrides (a bad value:
    the rule, with a warning)."""
    monkeypatch.delenv(cpu.STREAM_ENV, raising=False)
    cpu._stream_override.cache_clear()
    assert cpu.stream_bytes() == min(cpu.last_level_cache_bytes(), cpu.own_cache_bytes())
    assert cpu.own_cache_bytes(3) == 3 * cpu.private_cache_bytes()
    for caches, threads, want in ((((1, 48 << 10), (2, 2 << 20), (3, 260 << 20)), 2, 4 << 20),  # a host's L3
                                  (((1, 32 << 10), (2, 1 << 20), (3, 32 << 20)), 2, 2 << 20),
                                  (((1, 32 << 10), (2, 2 << 20), (3, 8 << 20)), 8, 8 << 20)):  # L3 the smaller
        monkeypatch.setattr(cpu, "_caches", lambda c=caches: c)
        for f in (cpu.private_cache_bytes, cpu.last_level_cache_bytes):
            f.cache_clear()
        try:
            assert cpu.stream_bytes(threads) == want, (caches, threads)
        finally:
            for f in (cpu.private_cache_bytes, cpu.last_level_cache_bytes):
                f.cache_clear()
    for given, want in (("0", 0), ("1048576", 1 << 20), ("lots", cpu.stream_bytes()), ("-5", cpu.stream_bytes())):
        cpu._stream_override.cache_clear()
        monkeypatch.setenv(cpu.STREAM_ENV, given)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert cpu.stream_bytes() == want
        assert bool(seen) == (given in ("lots", "-5"))  # (-5 was read as 0, always streaming, without a word)
    cpu._stream_override.cache_clear()


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
def test_cpu_build_is_cached_under_the_user_cache_dir():
    built = sorted(cpu.cache_dir().glob("normlab_cpu_*.so"))
    assert built and cpu.cache_dir().is_dir()


def test_kernels_save_no_more_than_torch():
    """Backward keeps only the input and per-row statistics (plus the weight)."""
    from normlab.lab.bench import saved_bytes

    x = torch.randn(512, 256, requires_grad=True)
    w = torch.randn(256, requires_grad=True)
    for impl in ("auto", "compiled", "cpu"):
        if impl != "auto" and not kernels.get_kernel(impl).supports("rms_norm", x, 1e-5):
            continue
        ours = saved_bytes(lambda: F.rms_norm(x, 256, w, impl=impl))  # noqa: B023
        assert ours <= x.numel() * 4 + 512 * 4 + 256 * 4, impl
        assert ours <= saved_bytes(lambda: torch.nn.functional.rms_norm(x, [256], w)), impl


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.rms, self.lin = normlab.LayerNorm(d), normlab.RMSNorm(d), nn.Linear(d, d)

    def forward(self, x):
        h = x + self.lin(self.ln(x))
        y, s = F.add_rms_norm(self.lin(h), h, h.shape[-1], self.rms.weight)
        return self.rms(y + s)


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_model_compiles_fullgraph_and_matches_eager():
    torch.manual_seed(0)
    m = _Block(32)
    x = torch.randn(4, 6, 32, requires_grad=True)
    y_eager = m(x)
    g_eager = torch.autograd.grad(y_eager.sum(), [x, *m.parameters()])
    compiled = torch.compile(m, fullgraph=True)  # raises on any graph break (a ctypes call would be one)
    y = compiled(x)
    g = torch.autograd.grad(y.sum(), [x, *m.parameters()])
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


MIXED = [  # (input dtype, weight dtype, residual_in_fp32, autograd on)
    (torch.float32, torch.bfloat16, False, True), (torch.float32, torch.float64, False, True),
    (torch.float64, torch.float32, False, True), (torch.bfloat16, torch.bfloat16, True, False),
    (torch.float16, torch.float16, True, False), (torch.bfloat16, torch.float32, False, False),
]


@pytest.mark.parametrize("x_dt,w_dt,fp32_residual,grad", MIXED, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("impl", ["native", "cpu"])
def test_weights_in_another_dtype_run_on_every_impl_that_takes_the_call(x_dt, w_dt, fp32_residual, grad, impl):
    """Weights may have any floating dtype: torch's kernel takes only the rows' dtype (or float32 under half
    rows), so ``native`` converts them as the C++ kernels do; a half ``add_layer_norm`` with a float32 ``s``
    (``residual_in_fp32``) reached torch's kernel with half weights and raised (``auto`` picks ``native``
    for such forwards where it times faster)."""
    if impl == "cpu" and not HAS_CPU:
        pytest.skip("no C++ compiler")
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(6, 40, generator=g).to(x_dt) for _ in range(2))
    w, b = ((1 + 0.3 * torch.randn(40, generator=g)).to(w_dt), (0.3 * torch.randn(40, generator=g)).to(w_dt))
    tol = 1e-5 if x_dt in (torch.float32, torch.float64) else 1e-2
    with torch.set_grad_enabled(grad):
        if not kernels.get_kernel(impl).supports("add_layer_norm", x, 1e-5):
            pytest.skip(f"{impl} does not take {x_dt} here")
        for op in ("layer_norm", "add_layer_norm"):
            outs = {}
            for name in (impl, "reference"):
                leaves = [t.clone().requires_grad_(grad) for t in (x, r, w, b)]
                xi, ri, wi, bi = leaves
                if op == "layer_norm":
                    y, extra = F.layer_norm(xi, 40, wi, bi, impl=name), []
                else:
                    y, s = F.add_layer_norm(xi, ri, 40, wi, bi, residual_in_fp32=fp32_residual, impl=name)
                    extra = [s]
                if grad:
                    (y.double().square().sum() + sum(t.double().sum() for t in extra)).backward()
                grads = [t.grad for t in (xi, wi, bi)] if grad else []
                outs[name] = (y, extra, grads)
            (y, extra, grads), (y_ref, extra_ref, grads_ref) = outs[impl], outs["reference"]
            assert y.dtype == x_dt
            torch.testing.assert_close(y.double(), y_ref.double(), rtol=tol, atol=tol)
            for a, c in zip(extra, extra_ref):  # s = x + r, one rounding: the same bits
                assert a.dtype == c.dtype and torch.equal(a, c)
            for a, c in zip(grads, grads_ref):
                assert a.dtype == c.dtype
                torch.testing.assert_close(a.double(), c.double(), rtol=1e-4, atol=1e-4)


FAST_IMPLS = ["auto", "reference", "native", "cpu"]  # compiled: the reference's math (rstd_of), compiled per variant


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_an_eps_that_vanishes_in_float32_still_gives_bias_for_a_constant_row(impl, op):
    """eps = 1e-50 is 0 in float32: var + eps of a constant row is 0, rsqrt gives inf and 0 * inf NaN. The
    reference guarded eps == 0 only (NaN), torch's kernel gives NaN (so it is not offered such calls), the
    C++ kernels round eps first and give the bias; every impl now gives the bias, forward and backward."""
    c = torch.full((2, 8), 3.0) if op == "layer_norm" else torch.zeros(2, 8)
    skip_unsupported(impl, op, c, 1e-50)
    c.requires_grad_()
    b = torch.full((8,), 0.5)
    y = F.layer_norm(c, 8, bias=b, eps=1e-50, impl=impl) if op == "layer_norm" else \
        F.rms_norm(c, 8, eps=1e-50, impl=impl) + b
    assert torch.equal(y, b.expand(2, 8))
    y.sum().backward()
    assert torch.isfinite(c.grad).all()


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_rows_of_zero_features_in_any_number_of_dims(impl, op):
    """D = 0 over a 3-D input (or a normalized shape with a 0) reshaped with an inferred row count, which a
    reshape cannot infer from 0 elements; now empty outputs of the input's shape, as torch gives."""
    for x, shape in ((torch.randn(2, 3, 0), 0), (torch.randn(3, 2, 0), (2, 0))):
        skip_unsupported(impl, op, x)
        if op.startswith("add_"):
            y, s = getattr(F, op)(x, torch.randn_like(x), shape, impl=impl)
            assert s.shape == x.shape
        else:
            y = getattr(F, op)(x, shape, impl=impl)
        assert y.shape == x.shape


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("x_dt,r_dt", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32),
                                       (torch.float16, torch.float32), (torch.bfloat16, torch.float16)])
def test_the_residual_sum_has_the_dtype_and_value_of_eager_addition(impl, x_dt, r_dt):
    """s = x + r is the stream: a bfloat16 branch added to a float32 stream (autocast's mix) came back in
    bfloat16, so every block rounded the stream (up to 0.85 off at 100); a float64 residual of float32 x was
    rounded to float32. Now s is eager ``x + r``, dtype and bits, and y has that dtype too, as eager
    ``layer_norm(x + r)``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 40, generator=g).to(x_dt)
    r = (torch.randn(50, 40, generator=g, dtype=torch.float64) * 100 + 0.123456).to(r_dt)
    skip_unsupported(impl, "add_layer_norm", x)
    y, s = F.add_layer_norm(x, r, 40, impl=impl)
    assert s.dtype == y.dtype == (x + r).dtype and torch.equal(s, x + r)
    y_ref = TF.layer_norm((x + r).double(), (40,)).to(y.dtype)
    torch.testing.assert_close(y, y_ref, **({"rtol": 1e-2, "atol": 1e-2} if y.dtype in HALF else {}))


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_a_residual_in_fp32_chain_keeps_y_in_the_half_dtype(impl):
    """residual_in_fp32's float32 s is the next call's residual: y came back float32 from the second call on
    (promoted with that residual), and the next bfloat16 layer refused it."""
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(32, 32).bfloat16()
    h, r = torch.randn(4, 32, generator=g).bfloat16(), torch.zeros(4, 32, dtype=torch.bfloat16)
    skip_unsupported(impl, "add_layer_norm", h)
    for _ in range(3):
        y, r = F.add_layer_norm(h, r, 32, residual_in_fp32=True, impl=impl)
        assert y.dtype == torch.bfloat16 and r.dtype == torch.float32
        h = lin(y)


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_rms_norms_default_eps_is_the_promoted_dtypes(impl):
    """float32 x with a float64 residual is normalized in float64, with float32's machine epsilon as eps: a row
    of [1e-5, 0, 0, 0] read 0.029 where eager rms_norm(x + r) reads 2."""
    x = torch.tensor([[1e-5, 0.0, 0.0, 0.0]])
    skip_unsupported(impl, "add_rms_norm", x)
    y, s = F.add_rms_norm(x, torch.zeros(1, 4, dtype=torch.float64), 4, impl=impl)
    torch.testing.assert_close(y, TF.rms_norm(x.double(), [4]))


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_a_forced_impl_that_cannot_run_the_call_is_an_error_under_torch_compile_too():
    """Inside a user's torch.compile a forced impl skipped its supports(): impl="native" for rms_norm ran
    torch's LayerNorm (the wrong op), silently."""
    f = torch.compile(lambda t: F.rms_norm(t, 16, impl="native"), backend="eager", fullgraph=False)
    with pytest.raises(ValueError, match="native"):
        f(torch.randn(3, 16) + 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_half_stores_round_as_torch_does_ties_nan_and_inf_included(impl, dtype):
    """s = x + r in half precision is formed in float32 and rounded once to nearest even: bitwise torch's eager
    ``x + r``, for random sums (ties among them), sums that overflow to inf, subnormal sums, NaN from inf - inf and
    NaN inputs of either sign, in the vector body and the tail. NaN's own bits are not compared: torch's paths
    disagree on them (0x7fc0 or 0xffff in bfloat16)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 75, generator=g).to(dtype)
    r = (torch.randn(64, 75, generator=g) * 2.0 ** torch.randint(-12, 2, (64, 75), generator=g)).to(dtype)
    big = torch.finfo(dtype).max
    x[0, :8], r[0, :8] = big, big  # overflow: inf
    x[1, :8], r[1, :8] = float("inf"), float("-inf")  # NaN
    x[2, 3], x[2, 74], x[3, 10] = float("nan"), float("nan"), -float("nan")
    if dtype == torch.bfloat16:  # subnormal sums, kept (a converting instruction reads them as zero)
        tiny = 2.0 ** -133 * (torch.arange(45) - 22.0)
        x[6, :45], r[6, :45] = tiny.to(dtype), (0.5 * tiny).round().to(dtype)
        x[6, 70:], r[6, 70:] = tiny[:5].to(dtype), tiny[:5].to(dtype)
        assert (x[6, :45] + r[6, :45] != 0).sum() > 40
    skip_unsupported(impl, "add_layer_norm", x)
    with torch.no_grad():
        _, s = F.add_layer_norm(x, r, 75, impl=impl)
    want = x + r
    assert torch.isnan(s[1, :8]).all() and torch.isinf(s[0, :8]).all()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(s), nan) and nan.sum() == 11
    assert torch.equal(s.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    # a float32 NaN whose mantissa is all ones (here a float32 bias's) stays NaN: rounding it up would carry
    # into the sign bit and write -0
    b = torch.zeros(75)
    b.view(torch.int32)[[5, 74]] = 0x7FFFFFFF
    with torch.no_grad():
        y = F.layer_norm(x[4:], 75, None, b, impl=impl)
    assert torch.isnan(y[:, [5, 74]]).all() and not torch.isnan(y[:, :5]).any()


@pytest.mark.parametrize("impl, op", [(i, o) for i in FAST_IMPLS for o in ("layer_norm", "rms_norm", "add_layer_norm",
                                                                         "add_rms_norm")]
                         + [("compiled", "layer_norm"), ("compiled", "add_rms_norm")])  # (a compile per variant)
def test_rows_of_zero_features_have_a_backward(impl, op):
    """D = 0 with weights that require grad: the compiled backward's block sum could not infer a row count from
    0 elements; every impl gives empty gradients of the inputs' shapes."""
    x, w = torch.randn(3, 0, requires_grad=True), torch.ones(0, requires_grad=True)
    skip_unsupported(impl, op, x)
    if op.startswith("add_"):
        y, s = getattr(F, op)(x, torch.randn(3, 0), 0, w, impl=impl)
    else:
        y = getattr(F, op)(x, 0, w, impl=impl)
    y.sum().backward()
    assert x.grad.shape == (3, 0) and w.grad.shape == (0,)


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("x_grad, r_grad", [(False, False), (True, False), (False, True)])
def test_s_requires_grad_as_eager_x_plus_r_does(impl, op, x_grad, r_grad):
    """s = x + r requires grad exactly when x or r does (only the weight requiring it: not s), on every impl,
    so code written for eager's s works whichever implementation auto picks."""
    x, r = torch.randn(4, 16, requires_grad=x_grad), torch.randn(4, 16, requires_grad=r_grad)
    w = torch.ones(16, requires_grad=True)
    skip_unsupported(impl, op, x)
    y, s = getattr(F, op)(x, r, 16, w, impl=impl)
    assert y.requires_grad and s.requires_grad == (x_grad or r_grad)
    y.sum().backward()
    assert w.grad is not None


def test_a_forced_cpu_impl_without_a_compiler_says_the_kernels_could_not_be_built(monkeypatch):
    """Without a working compiler, impl="cpu" said it "does not support layer_norm for torch.float32 on cpu":
    as if the call were outside its contract."""
    monkeypatch.setattr(cpu, "_load", lambda: (None, frozenset()))
    with pytest.raises(ValueError, match="impl 'cpu' cannot run layer_norm .* could not be built"):
        F.layer_norm(torch.randn(4, 16), 16, impl="cpu")
    with pytest.raises(ValueError, match="'cpu' does not support"):  # outside its contract (a meta tensor): as before
        F.layer_norm(torch.randn(4, 16, device="meta"), 16, impl="cpu")
