"""Shared test settings: dtype tolerances (defined once) and the impl list."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from normlab import kernels
from normlab.kernels import autotune

torch.set_num_threads(2)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HALF = [torch.float16, torch.bfloat16]

#: the accuracy rule's "small atol": our error vs float64 <= 2 * torch's error + ATOL
ATOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}

#: closeness of two float32-or-better results that should agree to rounding
RTOL_F32 = 1e-5
ATOL_F32 = 1e-6

#: every concrete implementation; each core numerics test runs on all of them
IMPL_NAMES = [n for n in kernels.IMPLS if n != "auto"]


_OWN_DISPATCH: str | None = None


def pytest_configure(config):
    """The run keeps ``auto``'s decisions in a file of its own (child processes too): decisions timed under the
    suite's load must not become the user's (``~/.cache/normlab/kernels/dispatch.json``)."""
    global _OWN_DISPATCH
    if autotune.FILE_ENV not in os.environ:
        _OWN_DISPATCH = tempfile.mkdtemp(prefix="normlab-test-dispatch-")
        os.environ[autotune.FILE_ENV] = os.path.join(_OWN_DISPATCH, "dispatch.json")


def pytest_unconfigure(config):
    if _OWN_DISPATCH is not None:
        os.environ.pop(autotune.FILE_ENV, None)
        shutil.rmtree(_OWN_DISPATCH, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_threads():
    """A test that sets torch's thread count (1 for deterministic simulation) leaves the next one at 2."""
    yield
    if torch.get_num_threads() != 2:
        torch.set_num_threads(2)


@pytest.fixture(params=IMPL_NAMES + ["auto"])
def impl(request) -> str:
    return request.param


def skip_unsupported(impl: str, op: str, x: torch.Tensor, eps: float | None = None) -> None:
    """Skip the calling test where a forced ``impl`` does not implement ``op`` for ``x``."""
    if eps is None:
        eps = 1e-5 if "layer" in op else torch.finfo(torch.float32).eps
    if impl != "auto" and not kernels.get_kernel(impl).supports(op, x, eps):
        pytest.skip(f"{impl} does not implement {op} for {x.dtype}, eps={eps}")


def max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference of ``a`` from a float64 reference."""
    return (a.double() - ref.double()).abs().max().item() if a.numel() else 0.0


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` (and its submodules) fails as it does where the plot extra is not installed."""
    import builtins

    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module, for the tests of its measures; the calling test module is skipped
    where the benchmarks folder is not beside the tests (an installed package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    if not path.exists():
        pytest.skip("the benchmarks folder is not beside the tests (an installed package)", allow_module_level=True)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
