"""Export safety: tracers and exporters record normlab's math, and leave the fast kernels on.

A kernel that runs outside torch's op set (a ctypes call, a compiled graph) is
invisible to ``torch.jit.trace`` and the legacy ONNX exporter: they would
record its output as a constant, and the exported model would replay the
example input's answer for every input. Each test therefore runs the exported
model on a *different* input than the one it was traced with.
"""
from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import warnings

import pytest
import torch

import normlab
from normlab import functional as F
from normlab import kernels
from normlab.kernels import fused

D, HEADS, LAYERS = 32, 4, 2
_DISPATCH = importlib.import_module("normlab.kernels.dispatch")  # the module (kernels.dispatch is its function)


def _encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(D, HEADS, LAYERS, norm="rmsnorm", placement="post").eval()
    with torch.no_grad():
        m(torch.randn(2, 5, D))  # warm: the fast kernels are built/compiled before any tracing
    return m


def _inputs(seed: int, b: int = 2, t: int = 5) -> torch.Tensor:
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed))


class _AddNorm(torch.nn.Module):
    """Bare ``add_rms_norm`` / ``add_layer_norm`` with weights, returning both outputs."""

    def __init__(self, op: str):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.op = op
        self.w = torch.nn.Parameter(1 + 0.3 * torch.randn(D, generator=g))
        self.b = torch.nn.Parameter(0.3 * torch.randn(D, generator=g))

    def forward(self, x, r):
        if self.op == "add_rms_norm":
            return F.add_rms_norm(x, r, D, self.w)
        return F.add_layer_norm(x, r, D, self.w, self.b)


def _ort(path, feeds: dict):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime missing: pip install 'normlab[export]'")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v.numpy() for k, v in feeds.items()})


def _round_trip(traced, tmp_path):
    """Save and load: a trace that holds a Python call (an opaque kernel) cannot be serialized."""
    path = tmp_path / "traced.pt"
    torch.jit.save(traced, str(path))
    return torch.jit.load(str(path))


def test_jit_trace_records_the_math_not_a_constant(tmp_path):
    m = _encoder()
    with torch.no_grad():
        traced = _round_trip(torch.jit.trace(m, (_inputs(0),)), tmp_path)
        x = _inputs(1)
        torch.testing.assert_close(traced(x), m(x), rtol=1e-5, atol=1e-5)


_TRACE_EVERY_MODEL = """
import warnings, torch, normlab
D, H, L = 32, 4, 2
models = [(normlab.LayerNorm(D), (2, 5, D)), (normlab.RMSNorm(D), (2, 5, D)), (normlab.ScaleNorm(D), (2, 5, D)),
          (normlab.TransformerEncoder(D, H, L), (2, 5, D)),
          (normlab.TransformerEncoder(D, H, L, norm="rmsnorm", placement="post"), (2, 5, D)),
          (normlab.VideoEncoder(d_model=D, n_heads=H, n_layers=L, n_patches=3), (2, 4, 3, D))]
for m, shape in models:
    m.eval()
    with torch.no_grad(), warnings.catch_warnings(record=True) as said:
        traced = torch.jit.trace(m, (torch.randn(*shape),))
        y = torch.randn(*shape)
        torch.testing.assert_close(traced(y), m(y), rtol=1e-5, atol=1e-5)
    for w in said:
        if issubclass(w.category, torch.jit.TracerWarning):
            print(type(m).__name__, w.filename, w.lineno)
print("traced", len(models))
"""


def test_a_trace_warns_of_nothing_the_checks_compare():
    """Sizes are tensors under torch.jit.trace: every shape check said "the trace might not generalize" (22
    TracerWarnings for a one-layer encoder), though a check only raises and the graph is the same. None now, in
    a program of its own (pytest's warning capture, around this file's imports, drops filters set at import)."""
    out = subprocess.run([sys.executable, "-c", _TRACE_EVERY_MODEL], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "traced 6", out.stdout


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_jit_trace_bare_add_norm(op, tmp_path):
    m = _AddNorm(op)
    with torch.no_grad():
        traced = _round_trip(torch.jit.trace(m, (_inputs(0), _inputs(2))), tmp_path)
        x, r = _inputs(3), _inputs(4)
        for a, b in zip(traced(x, r), m(x, r)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_legacy_onnx_export_of_encoder_matches_onnxruntime(tmp_path):
    pytest.importorskip("onnx", reason="onnx missing: pip install 'normlab[export]'")
    m = _encoder()
    path = tmp_path / "encoder.onnx"
    torch.onnx.export(m, (_inputs(0),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch", 1: "time"}})
    x = _inputs(5, b=3, t=7)  # another batch size and length than the export's example
    (got,) = _ort(path, {"x": x})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_legacy_onnx_export_of_bare_add_norm(op, tmp_path):
    pytest.importorskip("onnx", reason="onnx missing: pip install 'normlab[export]'")
    m = _AddNorm(op)
    path = tmp_path / f"{op}.onnx"
    torch.onnx.export(m, (_inputs(0), _inputs(2)), str(path), dynamo=False, input_names=["x", "r"])
    x, r = _inputs(6), _inputs(7)
    got = _ort(path, {"x": x, "r": r})
    with torch.no_grad():
        for a, b in zip(got, m(x, r)):
            torch.testing.assert_close(torch.from_numpy(a), b, rtol=1e-4, atol=1e-4)


def test_tracing_leaves_the_fast_kernels_on():
    """The old probe run during a trace marked the compiled kernels broken for the whole process."""
    x = torch.randn(4, 8).bfloat16()
    before = {op: kernels.resolve("auto", op, x, 1e-5) for op in kernels.OPS}
    m = _encoder()
    with torch.no_grad():
        torch.jit.trace(m, (_inputs(0),))
    assert {op: kernels.resolve("auto", op, x, 1e-5) for op in kernels.OPS} == before
    assert kernels.resolve("auto", "rms_norm", torch.randn(4, 8), 1e-5) in ("cpu", "compiled")


def test_exporting_flag_routes_every_impl_to_torch_ops():
    x = torch.randn(3, 8)
    with torch.no_grad():
        traced = torch.jit.trace(lambda t: F.rms_norm(t, 8, impl="reference"), (x,))
    assert "rsqrt" in str(traced.graph) or "sqrt" in str(traced.graph)
    assert not kernels.exporting()


def test_torch_export_of_encoder():
    m = _encoder()
    ep = torch.export.export(m, (_inputs(0),))
    x = _inputs(8)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), m(x), rtol=1e-5, atol=1e-5)


def test_dynamo_onnx_export_of_encoder(tmp_path):
    pytest.importorskip("onnx", reason="onnx missing: pip install 'normlab[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript missing: pip install 'normlab[export]'")
    m = _encoder()
    path = tmp_path / "encoder_dynamo.onnx"
    torch.onnx.export(m, (_inputs(0),), str(path), dynamo=True, input_names=["x"])
    x = _inputs(9)
    (got,) = _ort(path, {"x": x})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_a_trace_never_probes_or_disables_the_compiler():
    """Asked during a trace, the compiled path says "not here" for that call only: nothing is probed,
    nothing is remembered, and it is available again after the trace."""
    fused._probe.cache_clear()
    seen = []

    def f(t):
        seen.append(fused.available())
        return F.rms_norm(t, 8)

    with torch.no_grad():
        torch.jit.trace(f, (torch.randn(3, 8),), check_trace=False)
    assert seen == [False] and fused._probe.cache_info().currsize == 0
    assert fused.available()


@pytest.mark.parametrize("dynamo", [False, True])
def test_exporting_reads_what_torchs_onnx_flag_says_inside_the_exporter(dynamo, tmp_path):
    """``exporting()`` reads the ONNX exporter's flags bound once (torch's function imports them per call):
    inside either exporter it says what ``torch.onnx.is_in_onnx_export()`` says, and False outside."""
    if dynamo:
        pytest.importorskip("onnxscript", reason="onnxscript missing: pip install 'normlab[export]'")
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.onnx.is_in_onnx_export(), _DISPATCH._in_onnx_export()))
            return x * 2

    torch.onnx.export(Probe().eval(), (torch.randn(2, 3),), str(tmp_path / "probe.onnx"), dynamo=dynamo)
    assert seen and all(ours == theirs for theirs, ours in seen) and any(theirs for theirs, _ in seen)
    assert not kernels.exporting() and not torch.onnx.is_in_onnx_export()


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("impl", ["auto", "cpu", "reference"])
def test_torch_func_transforms_get_the_plain_math(op, impl):
    """vmap, grad and jacrev over normlab's functions give torch's numbers (float64): the C++ kernels cannot read
    a transform's storage-less tensors, and an autograd Function needs rules the transforms ask for; both
    raised before."""
    from torch.func import grad, jacrev, vmap

    x = torch.randn(4, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    r = torch.randn_like(x)
    eps = 1e-5 if "layer" in op else torch.finfo(torch.float64).eps

    def ours(t):
        if op == "layer_norm":
            return F.layer_norm(t, 8, impl=impl)
        if op == "rms_norm":
            return F.rms_norm(t, 8, eps=eps, impl=impl)
        return getattr(F, op)(t, torch.ones_like(t) if t.dim() < 3 else r[: t.shape[0]], 8, impl=impl)[0]

    def theirs(t):
        s = t + (torch.ones_like(t) if t.dim() < 3 else r[: t.shape[0]]) if op.startswith("add") else t
        if "layer" in op:
            return torch.nn.functional.layer_norm(s, (8,), eps=eps)
        return torch.nn.functional.rms_norm(s, (8,), eps=eps)

    torch.testing.assert_close(vmap(ours)(x[:, 0]), vmap(theirs)(x[:, 0]))
    torch.testing.assert_close(grad(lambda t: ours(t).pow(3).sum())(x), grad(lambda t: theirs(t).pow(3).sum())(x))
    torch.testing.assert_close(jacrev(ours)(x[0, 0]), jacrev(theirs)(x[0, 0]))


PAIRS = {"layer_norm": (lambda d: normlab.LayerNorm(d), lambda d: torch.nn.LayerNorm(d)),
         "rms_norm": (lambda d: normlab.RMSNorm(d), lambda d: torch.nn.RMSNorm(d))}


@pytest.mark.parametrize("op", list(PAIRS))
@pytest.mark.parametrize("d", [8, 768])  # 768: the C++ kernels' rows (below 512 auto may run torch's LayerNorm)
@pytest.mark.parametrize("frozen", [True, False])
def test_forward_mode_ad_gives_torchs_tangents(op, d, frozen):
    """``forward_ad.dual_level``: with nothing requiring grad the tangent came back None (read as zero, silently);
    with trainable weights NormFunction raised for want of a jvp. The plain ops carry the tangents."""
    import torch.autograd.forward_ad as fwAD

    ours, theirs = (make(d).double() for make in PAIRS[op])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in (ours, theirs):
            m.weight.copy_(torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
            m.requires_grad_(not frozen)
    x, t = (torch.randn(3, d, generator=g, dtype=torch.float64) for _ in range(2))
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ours(fwAD.make_dual(x, t))).tangent
        want = fwAD.unpack_dual(theirs(fwAD.make_dual(x, t))).tangent
    assert got is not None
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("op", list(PAIRS))
@pytest.mark.parametrize("d", [8, 768])
def test_batched_backward_gives_torchs_gradients(op, d):
    """``grad(..., is_grads_batched=True)`` and ``jacobian(..., vectorize=True)`` vmap over the backward: the
    C++ backward was handed storage-less batched gradients and raised."""
    ours, theirs = (make(d).double() for make in PAIRS[op])
    x = torch.randn(3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v = torch.randn(4, 3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got, want = (torch.autograd.grad(m(xx := x.clone().requires_grad_()), xx, v, is_grads_batched=True)[0]
                 for m in (ours, theirs))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.functional.jacobian(ours, x[:1], vectorize=True),
                               torch.autograd.functional.jacobian(theirs, x[:1], vectorize=True))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_meta_tensors_get_their_shapes(op):
    """A model built on the meta device (shapes without memory, to size it): RMSNorm went to the compiled kernel
    and failed inside inductor; every op now gives meta outputs of the input's shape, as torch's norms do."""
    x = torch.empty(3, 5, 768, device="meta")
    out = getattr(F, op)(x, x, 768) if op.startswith("add") else getattr(F, op)(x, 768)
    for y in out if isinstance(out, tuple) else (out,):
        assert y.is_meta and y.shape == x.shape
    norm = normlab.RMSNorm(768, device="meta") if "rms" in op else normlab.LayerNorm(768, eps=0.0, device="meta")
    assert norm(x).is_meta


@pytest.mark.parametrize("make", [lambda: normlab.LayerNorm(6), lambda: normlab.RMSNorm(6),
                                  lambda: normlab.LayerNorm((2, 3))])
def test_a_traced_norm_takes_inputs_of_another_rank(make):
    """Traced on ``[B, T, *shape]``, run on ``[N, *shape]``, ``[B, T, N, *shape]`` (video tokens) and ``shape``
    alone, as a traced torch LayerNorm is: the rows were made by a reshape to the example's row count."""
    torch.manual_seed(0)
    norm = make()
    shape = tuple(norm.normalized_shape)
    with warnings.catch_warnings():  # the argument checks' shape comparisons are constants to the tracer
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(norm, torch.randn(2, 3, *shape))
    for lead in ((6,), (2, 2, 2), ()):
        x = torch.randn(*lead, *shape)
        torch.testing.assert_close(traced(x), norm(x))


def test_an_exported_layer_norm_gives_the_bias_where_a_rows_squares_overflow(tmp_path):
    """A float32 row whose squared deviations overflow gives the bias (docs/numerics.md). The math clamped its
    variance with ``clamp_min(0)``, which exports as ONNX ``Clip`` with the float maximum as its default upper
    bound: the variance's inf became 3.4e38 in onnxruntime and the row gave values, not the bias."""
    pytest.importorskip("onnx", reason="onnx missing: pip install 'normlab[export]'")
    m = normlab.LayerNorm(8).eval().requires_grad_(False)
    with torch.no_grad():
        m.bias.copy_(torch.arange(8) / 10.0)
    path = tmp_path / "ln.onnx"
    torch.onnx.export(m, (torch.randn(2, 8),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "rows"}})
    x = torch.tensor([[3e20, -1e20, 2e20, 0.0, 1e20, -2e20, 5e19, 1.0], [1.0, 2, 3, 4, 5, 6, 7, 8]])
    (got,) = _ort(path, {"x": x})
    # the exported math's eager twin (`auto` may run torch's kernel for this call where it measures faster: NaN)
    want = F.layer_norm(x, (8,), m.weight, m.bias, impl="reference")
    torch.testing.assert_close(want[0], m.bias)  # eager: the bias
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-5)


def test_torch_export_of_a_training_conformer_block_with_its_masked_batchnorm():
    """The Conformer's convolution norm (a masked BatchNorm) checked its count of valid frames by reading a
    tensor's value, which ``torch.export`` cannot: a train-mode model holding one did not export at all."""
    torch.manual_seed(0)
    m = normlab.ConformerBlock(D, HEADS, kernel_size=3).train()
    ep = torch.export.export(m, (_inputs(0),))
    x = _inputs(10)
    got = ep.module()(x)
    want = m(x)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("traced_in,run_in", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                              (torch.float16, torch.bfloat16)])
def test_a_traced_norm_follows_the_dtype_it_is_run_in(op, traced_in, run_in):
    """A traced torch LayerNorm returns what it is given; normlab's traced math did not: its casts to the
    accumulation dtype and back were recorded with the example's dtype, so a norm traced in float32 returned
    float32 for a float64 input, with float32 statistics."""
    call = getattr(F, op)
    eps = 1e-6  # an explicit eps: the default RMSNorm eps is a constant of the traced dtype (docs/performance.md)

    def f(x, r, w, b, impl="auto"):  # traced: the reference's math, whatever impl says
        if op.startswith("add"):
            return call(x, r, D, w, eps=eps, impl=impl) if "rms" in op else call(x, r, D, w, b, eps=eps, impl=impl)
        return call(x, D, w, eps=eps, impl=impl) if "rms" in op else call(x, D, w, b, eps=eps, impl=impl)

    def inputs(dtype, seed):
        g = torch.Generator().manual_seed(seed)
        return tuple((k * torch.randn(3, 4, D, generator=g) + 0.5).to(dtype) for k in (1, 1)) + tuple(
            (1 + 0.3 * torch.randn(D, generator=g)).to(dtype) for _ in range(2))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(f, inputs(traced_in, 0), check_trace=False)
    args = inputs(run_in, 1)
    got, want = traced(*args), f(*args, impl="reference")
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert a.dtype == b.dtype == run_in
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Forced(torch.nn.Module):
    def __init__(self, op: str, impl: str):
        super().__init__()
        self.op, self.impl = op, impl

    def forward(self, x):
        return getattr(F, self.op)(x, D, impl=self.impl)


@pytest.mark.parametrize("impl", ["compiled", "cpu", "reference"])
def test_a_forced_impl_that_runs_eagerly_exports(impl):
    """``impl="compiled"`` forced under ``torch.export`` was refused: whether inductor is available is not
    asked while compiling (the answer would be about the tracer, not the machine), so it read as missing."""
    if not kernels.get_kernel(impl).supports("layer_norm", _inputs(0), 1e-5):
        pytest.skip(f"{impl} kernels unavailable here")
    m = _Forced("layer_norm", impl)
    ep = torch.export.export(m, (_inputs(0),))
    x = _inputs(1)
    torch.testing.assert_close(ep.module()(x), F.layer_norm(x, D, impl="reference"))


@pytest.mark.parametrize("trace", ["jit.trace", "torch.export"])
def test_a_forced_impl_refused_eagerly_is_refused_when_traced(trace):
    """``rms_norm(impl="native")`` (torch has no RMSNorm kernel) is an error eagerly; a tracer took it."""
    m = _Forced("rms_norm", "native")
    with pytest.raises(ValueError, match="'native' does not support rms_norm"):
        m(_inputs(0))
    with pytest.raises(ValueError, match="'native' does not support rms_norm"):
        torch.jit.trace(m, (_inputs(0),)) if trace == "jit.trace" else torch.export.export(m, (_inputs(0),))


@pytest.mark.parametrize("make", [lambda: normlab.LayerNorm(64), lambda: normlab.RMSNorm(64, eps=1e-6)])
def test_a_norm_traced_in_float32_keeps_float32_statistics_for_half_input(make):
    """The trace recorded no cast for its float32 example, so a float16 input got float16 statistics: rows at
    3e4 +- 100 read errors of 1-3 where eager reads 6e-4. A float64 input stays float64."""
    norm = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(norm, torch.randn(2, 64))
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * 100 + 3e4).half()
    got, want = traced(x), norm(x)
    assert got.dtype == torch.float16
    exact = norm.double()(x.double())
    assert (got.double() - exact).abs().max() <= 2 * (want.double() - exact).abs().max() + 1e-3
    x64 = torch.randn(4, 64, dtype=torch.float64)
    assert traced(x64).dtype == torch.float64
    torch.testing.assert_close(traced(x64), norm(x64), rtol=1e-12, atol=1e-12)
    # the zero that carries the dtype is made from the input: the graph runs on another device (a zero made on
    # the traced device was "on device cpu, not on the expected device meta")
    on_meta = traced.to("meta")(torch.empty(4, 64, device="meta", dtype=torch.float16))
    assert on_meta.device.type == "meta" and on_meta.dtype == torch.float16


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("impl", ["cpu", "auto"])
def test_a_batched_backward_into_the_sum_alone_gives_the_reference_s(op, impl):
    """A vectorized jacobian of the add ops' second output (s = x + r): the gradient of y is autograd's unbatched
    zeros, that of s batched, and the C++ backward was handed the batched one (it raised)."""
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    r = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got, want = (torch.autograd.functional.jacobian(lambda t, i=i: getattr(F, op)(t, r, 6, impl=i)[1], x,
                                                    vectorize=True) for i in (impl, "reference"))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("make", [lambda: normlab.LayerNorm(64), lambda: normlab.RMSNorm(64)])
def test_make_fx_records_the_norm_not_an_empty_tensor(make):
    """Under make_fx (and FakeTensorMode, functionalization: any dispatch mode) the C++ kernel ran on the
    mode's tensors: make_fx recorded only `empty_like` (its graph gave uninitialised memory) and FakeTensorMode
    crashed the process. A dispatch mode or a tensor subclass now gets the plain ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    norm = make()
    with torch.no_grad():
        graph = make_fx(norm)(torch.randn(4, 64))
        x = torch.randn(4, 64) * 3 + 1
        torch.testing.assert_close(graph(x), norm(x))


def test_fake_tensors_get_their_shapes_and_leave_the_model_usable():
    """A forward under FakeTensorMode (as shape inference and torch.compile's tracing do it) crashed in the
    kernel; the positional table it made was kept, so every later real forward failed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    enc = normlab.TransformerEncoder(16, 2, 1, pos="sinusoidal").eval()
    twin = copy.deepcopy(enc)  # (its tables are made anew)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        with FakeTensorMode(allow_non_fake_inputs=True):  # the first call: the tables are made here
            fake = enc(torch.randn(2, 5, 16))
        assert fake.shape == x.shape
        torch.testing.assert_close(enc(x), twin(x), atol=0, rtol=0)


@pytest.mark.parametrize("trace", ["make_fx", "fake"])
def test_a_training_conformer_block_runs_under_make_fx_and_fake_tensors(trace):
    """The masked BatchNorm's count check read a tensor's value outside ``torch.compile`` only: under make_fx
    and FakeTensorMode (which torch.nn.BatchNorm1d runs under) a train-mode Conformer raised."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    torch.manual_seed(0)
    m = normlab.ConformerBlock(D, HEADS, kernel_size=3).train()
    x = _inputs(0)
    if trace == "make_fx":
        graph = make_fx(lambda a: m(a)[0])(x)  # a block returns (hidden, pending residual)
        torch.testing.assert_close(graph(x), m(x)[0])  # train mode, no dropout: the same math
    else:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            assert m(mode.from_tensor(x))[0].shape == x.shape


def test_torch_export_of_a_bert_encoder_keeps_its_padding():
    """``BertEncoder`` checked its ids' range by reading their values, which ``torch.export`` cannot: the model
    did not export at all. Eagerly the check still refuses an id out of range."""
    from normlab.models.bert import BertEncoder
    torch.manual_seed(0)
    m = BertEncoder(dict(hidden_size=16, num_attention_heads=4, num_hidden_layers=1, intermediate_size=32,
                         vocab_size=50, max_position_embeddings=20)).eval()
    ids = torch.randint(1, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    ep = torch.export.export(m, (ids, mask))
    torch.testing.assert_close(ep.module()(ids, mask), m(ids, mask), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="vocab_size"):
        m(torch.tensor([[1, 50]]))
