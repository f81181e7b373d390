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


def plain(m: nn.Module, cls: type) -> bool:
    """Whether ``m`` computes what ``cls``'s own forward computes, so that normlab may skip its call or fuse it:
    of exactly that class (a subclass, or another module put in its place, runs its own forward), its
    ``forward`` not replaced on the instance (as accelerate's offloading hooks do), watched by no hook."""
    return type(m) is cls and "forward" not in m.__dict__ and not watched(m)


def idle_dropout(drop: nn.Module) -> bool:
    """Whether calling ``drop`` may be skipped: a plain ``nn.Dropout`` that drops nothing now (``p = 0``, or its
    own ``eval()``). Any other module put in its place (``nn.Identity()``, a custom dropout) runs."""
    return plain(drop, nn.Dropout) and not (drop.p and drop.training)
