"""normlab's kernels; :mod:`normlab.kernels.dispatch` is the one place that picks one.

Implementations (``impl=``), each a :class:`~normlab.kernels.base.Kernel` with
two methods, ``fwd`` and ``bwd`` (the C++ kernels' two entry points):

* ``"reference"``: the hand-derived teaching code (:mod:`normlab.reference`);
  always available, the definition every other path is tested against.
* ``"native"``: torch's own fused LayerNorm kernel pair, called as torch calls
  it (``torch.nn.functional.layer_norm``, torch's autograd node); float32 and
  float64 only (its half-precision CPU path keeps half-precision statistics
  and misses the bias on constant rows: docs/numerics.md); for
  ``add_layer_norm`` the eager add followed by that kernel.
* ``"compiled"``: normlab's fused math (:mod:`normlab.kernels.fused`) compiled
  by inductor; every op and dtype, CPU and CUDA, where a compiler is available.
* ``"cpu"``: normlab's C++ kernels (:mod:`normlab.kernels.cpu`): every op and
  floating dtype on CPU, single-pass backward with in-kernel weight-gradient
  partials; built at first use with the system's C++ compiler
  (:mod:`normlab.kernels.build`).
* ``"auto"``: the fixed table (:data:`PREFERENCE`), or where several kernels
  can run a call, the fastest of them measured on this machine once per kind
  of call (:mod:`normlab.kernels.autotune`; off with ``NORMLAB_AUTOTUNE=0`` or
  :func:`set_autotune`). Every choice satisfies ``docs/numerics.md``.

Under ``torch.jit`` tracing/scripting and ONNX export every impl runs plain
torch ops (:func:`traceable`), so exported models compute what eager ones do.
"""
from __future__ import annotations

from .autotune import set_autotune
from .dispatch import (
    IMPLS,
    NATIVE_BELOW_D,
    OPS,
    PREFERENCE,
    decide,
    dispatch,
    exporting,
    get_kernel,
    resolve,
    traceable,
    use_compiled,
)

__all__ = ["IMPLS", "NATIVE_BELOW_D", "OPS", "PREFERENCE", "decide", "dispatch", "exporting", "get_kernel", "resolve",
           "set_autotune", "traceable", "use_compiled"]
