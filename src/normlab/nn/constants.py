"""Constant tensors of a module (a sinusoidal table, a window, a filterbank) made where they are used."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels.dispatch import values_known


class DeviceConstant:
    """``make()``'s tensor, made at its first use for each device and dtype and kept.

    No parameter and no buffer: a non-persistent buffer is left unset by ``to_empty()`` after a meta-device
    build, and ``load_state_dict`` does not restore one. Nothing is kept while a tracer or ``torch.compile``
    runs (they record the making as ops), nor a tensor without values (a FakeTensor made under
    ``FakeTensorMode``, anything made while a dispatch mode runs): later calls would get it. A first use under
    ``torch.inference_mode`` makes an ordinary tensor, which autograd may record later. ``make`` is a
    tensor or a function of no arguments that makes one; the module pickles (``torch.save(model)``,
    ``copy.deepcopy``) where ``make`` does: a tensor, a module-level function or a ``functools.partial`` of
    one, not a lambda. The tensors made are not pickled.
    """

    def __init__(self, make: Callable[[], torch.Tensor] | torch.Tensor):
        self._make = make
        self._made: dict[tuple[torch.device, torch.dtype | None], torch.Tensor] = {}

    def __getstate__(self) -> dict:
        return {"_make": self._make, "_made": {}}

    def _new(self, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
        return (self._make if isinstance(self._make, torch.Tensor) else self._make()).to(device=device, dtype=dtype)

    def __call__(self, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor on ``device``, in ``dtype`` (None: ``make()``'s own)."""
        key = (device, dtype)
        made = self._made.get(key)
        if made is None:
            if torch.is_inference_mode_enabled():  # kept for later calls: an inference tensor would fail any
                with torch.inference_mode(False):  # that autograd records (a compiled model's, after an evaluation)
                    made = self._new(device, dtype)
            else:
                made = self._new(device, dtype)
            if values_known(made):  # (a trace's tensor kept for later calls would be a symbol)
                self._made[key] = made
        return made
