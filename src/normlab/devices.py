"""``--device cpu|cuda|cuda:N|auto``: one resolution rule for every command.

:func:`check_spec` validates the text without importing torch (argparse
``type=``, so ``--help`` stays fast); :func:`resolve` turns it into a
``torch.device`` or raises a one-line error (``--device cuda`` on a machine
without a GPU). :func:`default_device` runs code whose tensors carry no
device of their own (the study cells) on a device.
"""
from __future__ import annotations

import argparse
import contextlib
import re

SPEC = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")
HELP = "cpu, cuda, cuda:N or auto (CUDA when present)"
#: the same for commands that run under torchrun (``diarize train``, ``report``)
HELP_TORCHRUN = "cpu, cuda, cuda:N or auto (CUDA when present; under torchrun each process takes cuda:LOCAL_RANK)"


def check_spec(text: str) -> str:
    """argparse type: ``text`` if it names a device, else a usage error."""
    if not SPEC.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, got {text!r}")
    return text


def resolve(spec: str = "auto", local_rank: int | None = None):
    """``torch.device`` for ``spec``; ``local_rank`` (torchrun's ``LOCAL_RANK`` when None) picks the GPU of a process.

    Raises:
        BadValue (a ValueError): an unknown spec, CUDA asked for without a GPU, or a GPU index past the last.
    """
    import torch

    from ._checks import BadValue, env_whole

    if not SPEC.match(spec or ""):
        raise BadValue(f"--device must be cpu, cuda, cuda:N or auto, got {spec!r}")
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")  # LOCAL_RANK unread: it names a GPU
    if not torch.cuda.is_available():
        raise BadValue(f"--device {spec}: no CUDA GPU is available here (torch {torch.__version__}); "
                       "use --device cpu or auto")
    if ":" in spec:
        index = int(spec.split(":")[1])
    else:
        index = env_whole("LOCAL_RANK", "0") if local_rank is None else local_rank
    count = torch.cuda.device_count()
    if index >= count:
        raise BadValue(f"--device {spec}: GPU {index} asked for, {count} present")
    return torch.device("cuda", index)


@contextlib.contextmanager
def default_device(device):
    """Within the block, tensor factories without ``device=`` make tensors on ``device``.

    Unlike ``torch.device(...)`` as a context, a factory that draws from a CPU
    ``torch.Generator`` (as the study cells do, for seeded data) draws on the
    CPU and moves the result: the same numbers as on the CPU, on the device.
    """
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        yield
        return
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    factories = _device_constructors()

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in factories and kwargs.get("device") is None:
                gen = kwargs.get("generator")
                if gen is not None and gen.device.type == "cpu":
                    return func(*args, **kwargs).to(device)
                kwargs["device"] = device
            return func(*args, **kwargs)

    with _Mode():
        yield
