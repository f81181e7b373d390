"""``Kernel.infer``: the forward where no backward follows, without the statistics a backward needs."""
from __future__ import annotations

import pytest
import torch

from normlab import functional as F
from normlab.kernels import base, cpu

HAS_CPU = cpu.available()


@pytest.mark.skipif(not HAS_CPU, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", sorted(cpu.dtypes(), key=str))
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("add", [False, True])
def test_cpu_infer_is_the_forward_bit_for_bit_without_statistics(dtype, rms, add):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(37, 77, generator=g).to(dtype) for _ in range(2))
    w, b = (torch.randn(77, generator=g).to(torch.float64 if dtype == torch.float64 else torch.float32)
            for _ in range(2))
    k = cpu.CpuKernel()
    y, s, _, _ = k.fwd(x, r if add else None, w, None if rms else b, 1e-5, rms=rms)
    yi, si = k.infer(x, r if add else None, w, None if rms else b, 1e-5, rms=rms)
    assert torch.equal(y, yi)
    assert (s is None and si is None) if not add else torch.equal(s, si)


def test_a_call_nothing_records_runs_infer_and_keeps_no_statistics(monkeypatch):
    """Under ``no_grad`` the dispatcher asks the kernel for ``infer``; the reference kernel's is its forward."""
    called = []
    real = base.Kernel.infer
    monkeypatch.setattr(base.Kernel, "infer", lambda self, *a, **kw: called.append(self.name) or real(self, *a, **kw))
    x = torch.randn(4, 8)
    with torch.no_grad():
        y = F.layer_norm(x, 8, impl="reference")
    assert called == ["reference"]
    assert torch.equal(y, base.Kernel().fwd(x, None, None, None, 1e-5, rms=False)[0])
