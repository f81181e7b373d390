"""normlab's kernels; :mod:`normlab.kernels.dispatch` is the one place that picks one.

Implementations (``impl=``):

* ``"reference"``: the hand-derived teaching code (:mod:`normlab.reference`);
  always available, the definition every other path is tested against.
* ``"native"``: torch's own fused LayerNorm kernel pair, float32 and float64
  only (its half-precision CPU path keeps half-precision statistics); for
  ``add_layer_norm`` the eager add followed by that kernel.
* ``"compiled"``: normlab's fused math (:mod:`normlab.kernels.fused`) compiled
  by inductor; every op and dtype, CPU and CUDA, where a compiler is available.
* ``"cpu"``: normlab's C++ kernels (:mod:`normlab.kernels.cpu`): every op and
  floating dtype on CPU, single-pass backward with in-kernel weight-gradient
  partials; built at first use with the system's C++ compiler.
* ``"auto"``: the first of :data:`PREFERENCE` that satisfies the numerics
  contract for the op, device and dtype (measured in ``docs/performance.md``).

Under ``torch.jit`` tracing/scripting and ONNX export every impl runs plain
torch ops (:func:`traceable`), so exported models compute what eager ones do.
"""
from __future__ import annotations

from .dispatch import (IMPLS, NATIVE_BELOW_D, OPS, PREFERENCE, dispatch, exporting, get_kernel, resolve, traceable,
                       use_compiled)

__all__ = ["IMPLS", "NATIVE_BELOW_D", "OPS", "PREFERENCE", "dispatch", "exporting", "get_kernel", "resolve", "traceable",
           "use_compiled"]
