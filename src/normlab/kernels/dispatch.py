"""Dispatch: the one place that decides which implementation runs an op.

``functional`` validates its arguments and calls :func:`dispatch`; nothing else
picks a kernel. The decision uses only the call's own arguments and the
calling context, never a process-wide switch:

* **Export, tracing and ``torch.func`` transforms** (``torch.jit.is_tracing()``, ``torch.jit.is_scripting()``,
  ``torch.onnx.is_in_onnx_export()``, ``vmap``, ``grad``...): every impl runs :func:`traceable`, the
  math as plain differentiable torch ops, so the tracer records it. A kernel
  that runs outside torch's op set (ctypes, a compiled graph) would be recorded
  as a constant: the traced model would replay the example input's output.
* **Inside a user's ``torch.compile``**: impls that dynamo cannot trace
  (``cpu``) run the fused math, which dynamo inlines into the user's graph.
* **Otherwise**: the forced ``impl``, or for ``auto`` the first kernel in
  :data:`PREFERENCE` that satisfies the contract for the op, dtype and device
  (the fixed table), unless several kernels qualify: then the fastest of them,
  measured once per kind of call on this machine (:mod:`.autotune`).
  :func:`use_compiled` narrows ``auto`` for a ``with`` block (a context
  variable: local to the thread or task, restored on exit).
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import torch

from .._checks import BadValue, check_flag
from . import autotune
from .autograd import NormFunction
from .base import OP_SPECS, Kernel
from .cpu import CpuKernel
from .fused import CompiledKernel
from .native import NativeKernel

Tensor = torch.Tensor

_NATIVE = NativeKernel()
_KERNELS: dict[str, Kernel] = {k.name: k for k in (Kernel(), _NATIVE, CompiledKernel(), CpuKernel())}

#: names accepted by ``impl=``
IMPLS: tuple[str, ...] = ("auto", *_KERNELS)

OPS: tuple[str, ...] = tuple(OP_SPECS)

#: the order ``auto`` tries, per op (measured in docs/performance.md): normlab's C++ kernels
#: (CPU, every dtype), then torch's LayerNorm kernel (float32/float64), then the compiled
#: fused math (every dtype and device; Triton on CUDA), then the reference
PREFERENCE = {
    "layer_norm": ("cpu", "native", "compiled", "reference"),
    "rms_norm": ("cpu", "compiled", "reference"),
    "add_layer_norm": ("cpu", "native", "compiled", "reference"),
    "add_rms_norm": ("cpu", "compiled", "reference"),
}

_allow_compiled: contextvars.ContextVar[bool] = contextvars.ContextVar("normlab_allow_compiled", default=True)


@contextlib.contextmanager
def use_compiled(enabled: bool):
    """``with use_compiled(False): ...``: ``auto`` skips the compiled kernels inside the block.

    Compiled calls cost ~70 µs each in guards and wrapper code and compile on
    first use; for tiny tensors (the studies' d=64 models) other paths are
    faster and worker processes skip the cold start. The setting is a context
    variable: it applies to this thread (or asyncio task) and ends with the block.
    """
    check_flag(enabled, "use_compiled's argument")
    token = _allow_compiled.set(bool(enabled))
    try:
        yield
    finally:
        _allow_compiled.reset(token)


def _onnx_exporting():
    """``torch.onnx.is_in_onnx_export`` without its two imports per call (3.5 µs of a 10 µs LayerNorm).

    The flags it reads, bound once; where a torch version keeps them elsewhere, the public function itself.
    """
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        return torch.onnx.is_in_onnx_export
    if not (hasattr(GLOBALS, "in_onnx_export") and hasattr(_flags, "_is_onnx_exporting")):
        return torch.onnx.is_in_onnx_export
    return lambda: GLOBALS.in_onnx_export or _flags._is_onnx_exporting


_in_onnx_export = _onnx_exporting()


#: ``torch.jit.is_tracing`` without its Python wrapper, whose other half, ``is_scripting()``, is False wherever Python
#: runs the code (TorchScript, which does not, is not supported: README)
_is_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)


def exporting() -> bool:
    """True while ``torch.jit`` traces/scripts or the ONNX exporter runs."""
    if torch.compiler.is_compiling():  # dynamo knows torch's own functions (constants to it), not what is behind them
        return torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()
    return _is_tracing() or _in_onnx_export()


#: whether a ``torch.func`` transform (vmap, grad, jacrev, jvp...) is running: its tensors are wrappers with no
#: storage of their own, which a ctypes kernel cannot read, and an autograd Function needs rules the transforms
#: ask for; the plain ops are what they transform
_transforming = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


_forward_ad = torch.autograd.forward_ad


def _dual() -> bool:
    """Whether forward-mode AD (``torch.autograd.forward_ad.dual_level``) is on: its dual tensors carry tangents
    that neither a ctypes kernel nor ``NormFunction`` (no ``jvp``) propagates; the plain ops do."""
    return _forward_ad._current_level >= 0


def transformed() -> bool:
    """Whether a ``torch.func`` transform or forward-mode AD is running: only plain torch ops carry their wrapped
    tensors and tangents (a ctypes kernel, an autograd Function without ``jvp`` or a fused op with no derivative
    formula would not)."""
    return _transforming() or _dual()


#: how many ``TorchDispatchMode``s are active (FakeTensorMode, make_fx's proxy mode, functionalization)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)


def unreadable(x: Tensor) -> bool:
    """Whether ``x``'s values are not in memory that a kernel may read: a meta tensor, a tensor subclass (a
    FakeTensor, a FunctionalTensor, a wrapper that dispatches in Python), or any tensor while a
    ``TorchDispatchMode`` runs (``make_fx`` records ops, ``FakeTensorMode`` makes shapes only). A ctypes kernel
    would read uninitialised memory or crash there, and the mode would not see the op; the plain ops run."""
    if torch.compiler.is_compiling():  # dynamo's own fake tensors: it inlines the fused math (dispatch)
        return x.is_meta
    return x.is_meta or (type(x) is not Tensor and type(x) is not torch.nn.Parameter) or _dispatch_modes() > 0


def values_known(x: Tensor) -> bool:
    """Whether a check may read ``x``'s values (``int(x.max())``, ``if count < 2``): not while ``torch.compile``,
    ``torch.export``, ``make_fx``, ``FakeTensorMode`` or ``torch.jit.trace`` runs, where a value is a symbol (the
    check would stop the trace, or be baked into it as a constant)."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing() or unreadable(x))


def get_kernel(name: str) -> Kernel:
    """The kernel registered under ``name`` (not ``"auto"``; see :func:`resolve`)."""
    try:
        return _KERNELS[name]
    except KeyError:
        raise BadValue(f"unknown impl {name!r}; valid: {', '.join(IMPLS)}") from None


#: plain LayerNorm rows narrower than this (float32/float64) go to torch's kernel first: at
#: 65536x80 and 16384x256 it measured 1.1-1.2x faster than normlab's forward+backward
#: (docs/performance.md); from D = 768 up normlab's is the faster one
NATIVE_BELOW_D = 512


def _order(op: str, x: Tensor, d: int) -> tuple[str, ...]:
    if op == "layer_norm" and d < NATIVE_BELOW_D and x.dtype in (torch.float32, torch.float64):
        return ("native", *(n for n in PREFERENCE[op] if n != "native"))
    return PREFERENCE[op]


def _fixed(op: str, x: Tensor, eps: float, d: int) -> str:
    """The fixed table's choice: the first kernel of the op's order that can run the call."""
    for name in _order(op, x, d):
        if name == "compiled" and not _allow_compiled.get():
            continue
        if _KERNELS[name].supports(op, x, eps):
            return name
    return "reference"


def _unsupported(impl: str, op: str, x: Tensor, eps: float) -> BadValue:
    if get_kernel(impl).accepts(op, x, eps):  # within its contract: this machine could not build it
        return BadValue(f"impl {impl!r} cannot run {op} for {x.dtype} on this machine: its kernels could not be "
                        "built or loaded here (normlab builds them on Linux with a C++ compiler; where that failed, "
                        "a warning said why)")
    return BadValue(f"impl {impl!r} does not support {op} for {x.dtype} on {x.device.type} with eps={eps}")


def _check_op(op: str) -> None:
    if op not in OP_SPECS:  # a KeyError of the tables below otherwise
        raise BadValue(f"unknown op {op!r}; valid: {', '.join(OP_SPECS)}")


def decide(impl: str, op: str, x: Tensor, eps: float, d: int | None = None,
           records: bool | None = None) -> autotune.Decision:
    """Which kernel runs ``op`` on ``x`` eagerly, and why (see :func:`resolve`); ``records``: whether autograd
    records the call (None: grad mode decides), which picks the forward's or the forward and backward's timing."""
    _check_op(op)
    d = x.shape[-1] if d is None else d
    if impl != "auto":
        if not get_kernel(impl).supports(op, x, eps):
            raise _unsupported(impl, op, x, eps)
        return autotune.Decision(impl, "forced")
    if not autotune.enabled():
        return autotune.Decision(_fixed(op, x, eps, d), "fixed table (autotune off)")
    if exporting() or torch.compiler.is_compiling() or transformed() or unreadable(x):
        return autotune.Decision(_fixed(op, x, eps, d), "fixed table (no timer while tracing, exporting, compiling or "
                                                        "transforming)")
    timed = {n: _KERNELS[n] for n in _order(op, x, d) if n in autotune.TIMED and _KERNELS[n].supports(op, x, eps)}
    if len(timed) >= 2:
        known = autotune.TUNER.known(op, x, d, timed, records)  # decided before: in this process or the saved file
        if known is not None:
            return known
    fixed = _fixed(op, x, eps, d)
    if len(timed) < 2 or fixed not in timed:
        return autotune.Decision(fixed, "only candidate")
    return autotune.TUNER.choose(op, x, d, eps, timed, fixed, records)


def resolve(impl: str, op: str, x: Tensor, eps: float, d: int | None = None) -> str:
    """Map ``impl`` (possibly ``"auto"``) to the kernel name that runs ``op`` on ``x`` eagerly.

    ``d`` is the row length (``prod(normalized_shape)``; default ``x.shape[-1]``).
    A forced ``impl`` that cannot run ``op`` on ``x`` raises ValueError. ``auto``
    is the fixed table's choice or, where several kernels could run the call,
    the fastest of them measured here (:mod:`normlab.kernels.autotune`).
    """
    return decide(impl, op, x, eps, d).impl


def _eager(impl: str, op: str, x: Tensor, eps: float, d: int, records: bool) -> str:
    """:func:`resolve` for :func:`dispatch`, which has ruled out export, tracing and compiling: once ``auto`` has
    decided a kind of call, the answer is one dictionary lookup (a decision never changes within a process).
    ``records``: whether autograd records this call (a forward alone runs where nothing requires grad, even in
    grad mode: a frozen encoder's forward gets the forward's decision, not the training pair's)."""
    if impl != "auto" or not autotune.enabled():
        return resolve(impl, op, x, eps, d)
    # eps itself, not whether it counts as 0 (what the decision reads): the same answers, without a torch.finfo a call
    route = (op, x.dtype, x.device, d, eps, records, torch.get_num_threads(), _allow_compiled.get())
    routes = autotune.TUNER.routes
    name = routes.get(route)
    if name is None:
        name = routes[route] = decide(impl, op, x, eps, d, records).impl
    return name


def _check_forced(impl: str, op: str, x: Tensor, eps: float) -> None:
    """A forced ``impl`` under a tracer, exporter, transform or compiler: refused where it is eagerly (an unknown
    name; a call outside the kernel's contract, e.g. ``native`` for RMSNorm), but not for what the machine
    cannot do while tracing (build the C++ kernels, run inductor): the plain or the fused math runs there."""
    if impl != "auto" and not get_kernel(impl).accepts(op, x, eps):
        raise _unsupported(impl, op, x, eps)


def traceable(op: str, x: Tensor, r: Tensor | None, w, b, eps: float, s_dtype: torch.dtype | None = None):
    """The op as plain torch ops on ``N, D`` rows (autograd differentiates them): what tracers record.

    The reference kernel's forward (:mod:`normlab.reference`'s math), called outside any autograd Function.
    """
    y, s, _, _ = _KERNELS["reference"].fwd(x, r, w, b, eps, rms=OP_SPECS[op].rms, s_dtype=s_dtype)
    return y if r is None else (y, s)


def dispatch(op: str, x: Tensor, residual: Tensor | None, shape: tuple[int, ...], weight, bias, eps: float,
             *, impl: str = "auto", s_dtype: torch.dtype | None = None):
    """Run ``op`` over the trailing ``shape`` dims of ``x`` (validated by the caller).

    Returns ``y``, or ``(y, s)`` for the add ops, shaped like ``x``.
    """
    _check_op(op)
    d = math.prod(shape)
    # N, D rows; each reshape is a torch call of about a µs, so tensors already in shape pass as they are
    # (with D = 0 a reshape cannot infer N: then it is counted)
    rows = lambda t: t if t is None or (t.dim() == 2 and t.shape[1] == d and t.is_contiguous()) else \
        (t.reshape(-1, d) if d else t.reshape(math.prod(t.shape[:t.dim() - len(shape)]), 0)).contiguous()  # noqa: E731
    w = weight if weight is None or weight.dim() == 1 else weight.reshape(d)
    b = bias if bias is None or bias.dim() == 1 else bias.reshape(d)
    # tracers, torch.func transforms, forward-mode AD, meta and fake tensors and dispatch modes get the plain ops
    if exporting() or transformed() or unreadable(x):
        _check_forced(impl, op, x, eps)
        if d > 0:  # rows by a reshape of (-1, D) and back by reshape_as: a trace records no batch size or rank
            flat = lambda t: None if t is None else t.reshape(-1, d)  # noqa: E731
            out = traceable(op, flat(x), flat(residual), w, b, eps, s_dtype)
            return out.reshape_as(x) if residual is None else (out[0].reshape_as(x), out[1].reshape_as(x))
        out = traceable(op, rows(x), rows(residual), w, b, eps, s_dtype)
    else:
        records = torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                               or (w is not None and w.requires_grad)
                                               or (b is not None and b.requires_grad))
        if torch.compiler.is_compiling():
            # dynamo cannot trace a ctypes call; it inlines the fused math into the user's graph instead
            _check_forced(impl, op, x, eps)
            kernel = get_kernel("compiled" if impl in ("auto", "cpu") else impl)
        else:
            kernel = get_kernel(_eager(impl, op, x, eps, d, records))
            if records and x.is_inference():  # made under inference_mode, trained on after (a frozen front end's
                x = x.clone()  # features): autograd may not save it; torch's RMSNorm, which saves x**2, trains
        spec, s_dt = OP_SPECS[op], s_dtype or x.dtype
        # torch's kernel pair on the caller's shapes, under torch's own autograd node; except for a bias without
        # a weight where autograd records: torch's second derivative then leaves out the bias (it reads 0), so
        # the same kernel pair runs under normlab's Function, whose double backward is the reference's
        if kernel is _NATIVE and not (weight is None and bias is not None and torch.is_grad_enabled()):
            return _NATIVE.run(x, residual, shape, weight, bias, eps, s_dt)
        if records:
            out = NormFunction.apply(rows(x), rows(residual), w, b, eps, spec.rms, s_dt, kernel)
        else:  # nothing for autograd to record: the kernel alone (an autograd Function costs ~50 µs a call)
            y, s = kernel.infer(rows(x), rows(residual), w, b, eps, rms=spec.rms, s_dtype=s_dt)
            out = y if s is None else (y, s)
    shaped = lambda t: t if t.shape == x.shape else t.reshape_as(x)  # noqa: E731   (reshape(x.shape): 1 µs more)
    if residual is None:
        return shaped(out)
    return shaped(out[0]), shaped(out[1])


__all__ = ["IMPLS", "OPS", "PREFERENCE", "decide", "dispatch", "exporting", "get_kernel", "resolve", "traceable",
           "transformed", "unreadable", "use_compiled"]
