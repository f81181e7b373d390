"""Whether a forward hook watches a module: the one test behind every module call normlab skips for speed."""
from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module


def watched(m: nn.Module) -> bool:
    """True when a hook is registered on ``m`` or on every module (``register_module_forward_hook`` and the
    like): forward, pre-forward, backward or pre-backward. Then ``m`` must be called as a module, even where its
    call changes nothing (dropout in eval mode or at p = 0) or a fused op could stand in for it."""
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or _module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks or _module._global_backward_pre_hooks)
