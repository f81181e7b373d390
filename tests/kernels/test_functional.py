"""Public functional API: signatures, shapes, gradcheck, the add variants, bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from conftest import skip_unsupported
from normlab import functional as F


def _d(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("with_w,with_b", [(True, True), (True, False), (False, True), (False, False)])
def test_gradcheck_layer_norm(with_w, with_b, impl):
    x = _d(3, 4, 5)
    skip_unsupported(impl, "layer_norm", x)
    w = _d(4, 5) if with_w else None
    b = _d(4, 5) if with_b else None
    fn = lambda x, w, b: F.layer_norm(x, (4, 5), w, b, impl=impl)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("with_w", [True, False])
def test_gradcheck_rms_norm(with_w, impl):
    x, w = _d(6, 7), (_d(7) if with_w else None)
    skip_unsupported(impl, "rms_norm", x)
    assert torch.autograd.gradcheck(lambda x, w: F.rms_norm(x, 7, w, impl=impl), (x, w))


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_gradcheck_add_norms(op, impl):
    x, r, w, b = _d(2, 3, 8), _d(2, 3, 8), _d(8), _d(8)
    skip_unsupported(impl, op, x)
    fn = getattr(F, op)
    if op == "add_layer_norm":
        assert torch.autograd.gradcheck(lambda x, r, w, b: fn(x, r, 8, w, b, impl=impl), (x, r, w, b))
    else:
        assert torch.autograd.gradcheck(lambda x, r, w: fn(x, r, 8, w, impl=impl), (x, r, w))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_second_derivatives_on_every_impl(op, impl):
    """`create_graph=True` (gradient penalties) raised "differentiate twice" wherever normlab's kernels ran."""
    x, r, w, b = _d(3, 2, 6), _d(3, 2, 6), _d(6), _d(6)
    skip_unsupported(impl, op, x)
    fn = getattr(F, op)
    calls = {"layer_norm": (lambda x, w, b: fn(x, 6, w, b, impl=impl), (x, w, b)),
             "rms_norm": (lambda x, w: fn(x, 6, w, impl=impl), (x, w)),
             "add_layer_norm": (lambda x, r, w, b: fn(x, r, 6, w, b, impl=impl), (x, r, w, b)),
             "add_rms_norm": (lambda x, r, w: fn(x, r, 6, w, impl=impl), (x, r, w))}
    assert torch.autograd.gradgradcheck(*calls[op])


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_second_derivatives_with_a_bias_and_no_weight(op, impl):
    """torch's own double backward of ``layer_norm(x, shape, None, bias)`` drops the bias (its second derivative
    read 0 on ``native``, and on ``auto`` wherever that chose torch's kernel)."""
    x, r, b = _d(3, 2, 6), _d(3, 2, 6), _d(6)
    skip_unsupported(impl, op, x)
    if op == "layer_norm":
        assert torch.autograd.gradgradcheck(lambda x, b: F.layer_norm(x, 6, None, b, impl=impl), (x, b))
    else:
        assert torch.autograd.gradgradcheck(lambda x, r, b: F.add_layer_norm(x, r, 6, None, b, impl=impl), (x, r, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gradient_penalty_matches_torch_and_the_first_derivative_is_unchanged(dtype, impl):
    x = torch.randn(16, 32, dtype=dtype, requires_grad=True)
    skip_unsupported(impl, "layer_norm", x)
    w = torch.randn(32, dtype=dtype, requires_grad=True)
    b = torch.randn(32, dtype=dtype, requires_grad=True)
    dy = torch.randn(16, 32, dtype=dtype)

    def penalty(norm):
        gx, = torch.autograd.grad((norm(x, (32,), w, b) * dy).sum(), x, create_graph=True)
        return gx, torch.autograd.grad((gx.float() ** 2).sum(), (x, w))

    gx, (hx, hw) = penalty(lambda *a: F.layer_norm(*a, impl=impl))
    tx, (thx, thw) = penalty(TF.layer_norm)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    for ours, theirs in ((gx, tx), (hx, thx), (hw, thw)):
        torch.testing.assert_close(ours.float(), theirs.float(), **tol)
    plain, = torch.autograd.grad((F.layer_norm(x, (32,), w, b, impl=impl) * dy).sum(), x)
    torch.testing.assert_close(gx, plain, **tol)  # create_graph changes how, not what


@pytest.mark.parametrize("shape_arg", [6, [6], (6,), torch.Size([6])])
def test_normalized_shape_forms(shape_arg):
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(F.layer_norm(x, shape_arg), TF.layer_norm(x, [6]))
    torch.testing.assert_close(F.rms_norm(x, shape_arg), TF.rms_norm(x, [6]))


def test_video_tokens_multi_dim_normalized_shape():
    """[B, T, N, D] video tokens normalized jointly over (N, D), as torch does."""
    x = torch.randn(2, 3, 5, 8) * 2 + 1
    w, b = torch.randn(5, 8), torch.randn(5, 8)
    y = F.layer_norm(x, (5, 8), w, b)
    torch.testing.assert_close(y, TF.layer_norm(x, [5, 8], w, b))
    z = (y - b) / w  # undo the affine: each (N, D) block has mean 0 and variance 1
    assert z.mean(dim=(-2, -1)).abs().max() < 1e-5
    torch.testing.assert_close(z.var(dim=(-2, -1), unbiased=False), torch.ones(2, 3), rtol=0, atol=1e-4)
    torch.testing.assert_close(F.rms_norm(x, (5, 8), w), TF.rms_norm(x, [5, 8], w))


@pytest.mark.parametrize("x_shape,norm_shape", [((5, 8), (5, 8)), ((8, 6), (6,)), ((3, 5, 8), (5, 8))])
def test_rows_and_outputs_keep_their_shapes(x_shape, norm_shape, impl):
    """A 2-D input normalized over both of its dims is one row, not five; a non-contiguous 2-D input is read as
    its values; every op's outputs come back in the input's shape."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*x_shape, generator=g)
    if len(x_shape) == 2 and len(norm_shape) == 1:
        x = torch.randn(x_shape[::-1], generator=g).t()  # a transposed view: not contiguous
    r = torch.randn(x.shape, generator=g)
    w = torch.randn(norm_shape, generator=g)
    skip_unsupported(impl, "add_layer_norm", x)
    torch.testing.assert_close(F.layer_norm(x, norm_shape, w, impl=impl), TF.layer_norm(x, list(norm_shape), w))
    torch.testing.assert_close(F.rms_norm(x, norm_shape, w, impl=impl) if impl != "native" else
                               TF.rms_norm(x, list(norm_shape), w), TF.rms_norm(x, list(norm_shape), w))
    y, s = F.add_layer_norm(x, r, norm_shape, w, impl=impl)
    assert y.shape == s.shape == x.shape
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y, TF.layer_norm(x + r, list(norm_shape), w))


def test_default_eps_values():
    x = torch.randn(4, 16) * 1e-4  # eps-sensitive scale
    torch.testing.assert_close(F.layer_norm(x, 16), TF.layer_norm(x, [16]))  # eps 1e-5
    torch.testing.assert_close(F.rms_norm(x, 16), TF.rms_norm(x, [16]))  # eps None


def test_add_layer_norm_returns_sum_and_norm():
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    w, b = torch.randn(8), torch.randn(8)
    y, s = F.add_layer_norm(x, r, 8, w, b)
    assert torch.equal(s, x + r)
    torch.testing.assert_close(y, TF.layer_norm(x + r, [8], w, b))
    y, s = F.add_rms_norm(x, r, 8, w)
    assert torch.equal(s, x + r)
    torch.testing.assert_close(y, TF.rms_norm(x + r, [8], w))


def test_add_norm_gradient_flows_through_both_outputs():
    x, r, w, b = _d(4, 8), _d(4, 8), _d(8), _d(8)
    y, s = F.add_layer_norm(x, r, 8, w, b)
    dy, ds = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    gx, gr = torch.autograd.grad((y * dy).sum() + (s * ds).sum(), (x, r))
    x2 = x.detach().requires_grad_()
    s2 = x2 + r.detach()
    (gx2,) = torch.autograd.grad((TF.layer_norm(s2, [8], w, b) * dy).sum() + (s2 * ds).sum(), (x2,))
    torch.testing.assert_close(gx, gx2)
    torch.testing.assert_close(gr, gx2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_residual_in_fp32(dtype):
    x, r = torch.randn(4, 32).to(dtype), torch.randn(4, 32).to(dtype)
    y, s = F.add_layer_norm(x, r, 32, residual_in_fp32=True)
    assert s.dtype == torch.float32 and y.dtype == dtype
    assert torch.equal(s, x.float() + r.float())
    y, s = F.add_rms_norm(x, r, 32)
    assert s.dtype == dtype
    y, s = F.add_layer_norm(x.float(), r.float(), 32, residual_in_fp32=True)  # no-op for float32
    assert s.dtype == torch.float32


def test_half_input_with_float32_weight():
    x = torch.randn(4, 16).to(torch.bfloat16)
    w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    y = F.layer_norm(x, 16, w, b)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_float64_weights_of_float32_input_are_rounded_to_float32(op, impl):
    """Every kernel takes the weights in the accumulation dtype: the reference and compiled kernels (and every
    trace, which runs the reference's math) formed `y * w + b` in float64 and rounded once, so the same call
    gave other bits than the C++ kernel's."""
    torch.manual_seed(0)
    x, r = torch.randn(64, 256), torch.randn(64, 256)
    skip_unsupported(impl, op, x)
    w, b = torch.randn(256, dtype=torch.float64), torch.randn(256, dtype=torch.float64)
    fn, add = getattr(F, op), op.startswith("add")
    args = lambda w, b: ((x, r) if add else (x,)) + ((256, w) if "rms" in op else (256, w, b))  # noqa: E731
    with torch.no_grad():
        wide, rounded = fn(*args(w, b), impl=impl), fn(*args(w.float(), b.float()), impl=impl)
    for a, c in zip(*(o if add else (o,) for o in (wide, rounded))):
        assert a.dtype == torch.float32 and torch.equal(a, c)


# ------------------------------------------------------------------ bad input


def test_mismatched_shape_names_both():
    x = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match=r"normalized_shape \[5\].*\[2, 4, 6\]"):
        F.layer_norm(x, 5)
    with pytest.raises(ValueError, match=r"\[4, 5\]"):
        F.rms_norm(x, (4, 5))
    with pytest.raises(ValueError):
        F.layer_norm(torch.randn(6), (2, 6))  # more normalized dims than the input has


@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm"])
def test_wrong_weight_shape(fn):
    x = torch.randn(3, 6)
    with pytest.raises(ValueError, match=r"weight has shape \[1, 6\] but normalized_shape is \[6\]"):
        getattr(F, fn)(x, 6, torch.ones(1, 6))
    with pytest.raises(ValueError, match="weight"):
        getattr(F, fn)(x, 6, torch.ones(5))


def test_wrong_bias_shape():
    with pytest.raises(ValueError, match="bias"):
        F.layer_norm(torch.randn(3, 6), 6, torch.ones(6), torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_input_is_type_error(dtype):
    x = torch.ones(3, 6, dtype=dtype)
    for fn in (F.layer_norm, F.rms_norm):
        with pytest.raises(TypeError, match="floating-point"):
            fn(x, 6)


def test_integer_weight_is_type_error():
    with pytest.raises(TypeError, match="weight"):
        F.layer_norm(torch.randn(2, 3), 3, torch.ones(3, dtype=torch.long))


def test_residual_shape_mismatch():
    with pytest.raises(ValueError, match="residual"):
        F.add_layer_norm(torch.randn(4, 8), torch.randn(1, 8), 8)


@pytest.mark.parametrize("eps", [-1e-5, float("nan"), float("inf"), 10**400])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        F.layer_norm(torch.randn(2, 3), 3, eps=eps)


def test_unknown_impl_lists_valid():
    with pytest.raises(ValueError, match="reference"):
        F.layer_norm(torch.randn(2, 3), 3, impl="nope")


def test_eps_of_any_real_number_type():
    """torch takes a numpy scalar eps; so does normlab (the same result as the float)."""
    np = pytest.importorskip("numpy")
    x = torch.randn(2, 8)
    assert torch.equal(F.layer_norm(x, 8, eps=np.float32(1e-3)), F.layer_norm(x, 8, eps=float(np.float32(1e-3))))


@pytest.mark.parametrize("shape", [[8.7], ["8"], [True], 8.0, (8, 2.0)])
def test_a_dimension_must_be_an_integer(shape):
    """[8.7] was truncated to 8 and ["8"] parsed: a dimension is an integer, never a float, string or bool."""
    with pytest.raises(TypeError, match="normalized_shape"):
        F.layer_norm(torch.randn(2, 8), shape)


@pytest.mark.parametrize("which", ["weight", "bias", "residual"])
def test_a_tensor_on_another_device_is_one_clear_error(which):
    """The C++ kernels read every tensor through one pointer space: a meta (or CUDA) weight, bias or residual
    beside a CPU input was read as absent or as host memory (an uninitialised ``s``); now one error naming
    both devices, on every op."""
    x, meta = torch.randn(3, 8), torch.randn(8, device="meta")
    kw = {"weight": meta} if which == "weight" else {"bias": meta} if which == "bias" else {}
    r = torch.randn(3, 8, device="meta") if which == "residual" else torch.randn(3, 8)
    calls = [lambda: F.add_layer_norm(x, r, 8, **kw)]
    if which != "residual":
        calls.append(lambda: F.layer_norm(x, 8, **kw))
    if which != "bias":
        calls += [lambda: F.add_rms_norm(x, r, 8, **kw)] + ([lambda: F.rms_norm(x, 8, **kw)] if kw else [])
    for call in calls:
        with pytest.raises(ValueError, match=f"{which} is on meta but the input is on cpu"):
            call()


def test_bad_normalized_shape_type():
    with pytest.raises(TypeError):
        F.layer_norm(torch.randn(2, 3), "3")
    with pytest.raises(ValueError):
        F.layer_norm(torch.randn(2, 3), ())


def test_an_unknown_op_is_one_line_naming_the_valid_ones():
    """``kernels.resolve("auto", "layernorm", ...)`` was a bare KeyError."""
    from normlab import kernels

    x = torch.randn(2, 8)
    for call in (lambda: kernels.resolve("auto", "layernorm", x, 1e-5),
                 lambda: kernels.dispatch("layernorm", x, None, (8,), None, None, 1e-5)):
        with pytest.raises(ValueError, match="unknown op 'layernorm'; valid: layer_norm, rms_norm"):
            call()


def test_switches_that_are_not_flags_are_refused():
    """Read by truthiness, "no" switched each of these on: residual_in_fp32="no" kept s in float32,
    set_autotune("off") left autotuning on, use_compiled("no") allowed the compiled kernels."""
    import normlab.functional as NF
    from normlab import kernels
    from normlab.kernels import autotune

    x = torch.randn(2, 8).half()
    with pytest.raises(TypeError, match="^residual_in_fp32 must be True or False, got 'no'$"):
        NF.add_layer_norm(x, x, 8, residual_in_fp32="no")
    assert NF.add_rms_norm(x, x, 8, residual_in_fp32=0)[1].dtype == torch.float16
    before = autotune.enabled()
    with pytest.raises(TypeError, match="set_autotune's argument must be True or False, got 'off'"):
        autotune.set_autotune("off")
    assert autotune.enabled() == before
    with pytest.raises(TypeError, match="use_compiled's argument must be True or False, got 'no'"):
        with kernels.use_compiled("no"):
            pass


def test_a_forced_cpu_kernel_on_a_dtype_it_has_none_for_says_so():
    """float8 was blamed on a build that "could not be built or loaded here": the kernels were built, float8 is
    no dtype of theirs."""
    import normlab.functional as NF

    with pytest.raises(ValueError, match=r"^impl 'cpu' does not support layer_norm for torch.float8_e4m3fn on cpu"):
        NF.layer_norm(torch.randn(3, 8).to(torch.float8_e4m3fn), 8, impl="cpu")
