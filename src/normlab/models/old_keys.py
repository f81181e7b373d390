"""State-dict keys of older normlab files: one clear error on load, and the converter.

Two renames changed the keys of every encoder:

* attention's separate ``q_proj``/``k_proj``/``v_proj`` became one fused
  ``qkv_proj`` (rows ``[q; k; v]``);
* a residual unit's single ``norm`` became a named slot: ``pre_norm`` where the
  layer is pre-style, ``post_norm`` otherwise.

Loading such a state dict into a :class:`~normlab.models.stack.Stack` raises
:class:`OldKeysError` once the stack has loaded, where keys of today's layout
are still missing (a load pre-hook of the user's may have converted them:
torch runs it first); convert the file once::

    python -c "import normlab.models as m; m.upgrade_file('model.pt')"

(:func:`upgrade_file` reads the placement from the file's ``config`` where it
has one, as normlab's EEND model files do; otherwise pass ``placement=``.)
"""
from __future__ import annotations

import pathlib
import re

import torch

from .. import written
from .._checks import BadValue
from .placement import slots

_QKV = re.compile(r"^(?P<head>.*\.)?(?P<which>[qkv])_proj\.(?P<leaf>weight|bias)$")
_UNIT_NORM = re.compile(r"^(?P<head>(?:.*\.)?layers\.(?P<layer>\d+)\.[A-Za-z0-9_]+\.)norm\.(?P<leaf>.+)$")

#: how to convert, named in the error
FIX = "convert the file once with normlab.models.upgrade_file(path) (or upgrade_state_dict(state, placement))"


class OldKeysError(BadValue):
    """A state dict written with keys of an older normlab layout."""


def old_keys(keys) -> list[str]:
    """The keys among ``keys`` that only older normlab files use."""
    return [k for k in keys if _QKV.match(k) or _UNIT_NORM.match(k)]


def foreign_old_keys(state_dict: dict, module: torch.nn.Module, prefix: str = "") -> list[str]:
    """The keys of ``state_dict`` under ``prefix`` that only older normlab files use and ``module`` lacks."""
    candidates = old_keys(k for k in state_dict if k.startswith(prefix))
    if not candidates:  # (the usual case: nothing to compare, no key set built)
        return []
    own = _own_keys(module)
    return [k for k in candidates if k[len(prefix):] not in own]


def refuse_unconverted(old: list[str], missing: list[str], prefix: str = "") -> None:
    """After a load: raise :class:`OldKeysError` where the state dict held old keys (``old``) and keys of
    today's layout under ``prefix`` are still missing, so nothing (a load pre-hook of the user's) converted
    them. Old keys beside a complete set of today's are left to ``strict``, as any other unexpected key."""
    if old and any(k.startswith(prefix) for k in missing):
        raise OldKeysError(f"state dict uses keys of an older normlab layout (e.g. {old[0]!r}); {FIX}")


def _own_keys(module: torch.nn.Module) -> set[str]:
    """The parameter and persistent buffer keys of ``module.state_dict()``, without calling it: that would run
    the user's state-dict hooks (and build every tensor's entry) on each load."""
    keys = set()
    for name, m in module.named_modules(remove_duplicate=False):
        at = f"{name}." if name else ""
        keys.update(at + k for k, v in m._parameters.items() if v is not None)
        keys.update(at + k for k, v in m._buffers.items() if v is not None and k not in m._non_persistent_buffers_set)
    return keys


def upgrade_state_dict(state: dict, placement: str, n_layers: int | None = None) -> dict:
    """``state`` with today's keys: q/k/v projections fused, unit norms named by slot; tensors unchanged.

    ``placement`` (and ``n_layers``, default: the highest layer index + 1) say
    which slot each unit's old ``norm`` was: ``pre_norm`` where the layer is
    pre-style, ``post_norm`` otherwise.
    """
    layers = [int(m.group("layer")) for k in state if (m := _UNIT_NORM.match(k))]
    n = n_layers or (max(layers) + 1 if layers else 1)
    out: dict = {}
    for key, t in state.items():
        if m := _QKV.match(key):
            if m.group("which") == "q":
                head, leaf = m.group("head") or "", m.group("leaf")
                out[f"{head}qkv_proj.{leaf}"] = torch.cat([state[f"{head}{w}_proj.{leaf}"] for w in "qkv"])
        elif m := _UNIT_NORM.match(key):
            slot = "pre_norm" if slots(placement, int(m.group("layer")), n).pre else "post_norm"
            out[f"{m.group('head')}{slot}.{m.group('leaf')}"] = t
        else:
            out[key] = t
    return out


def upgrade_file(path: str | pathlib.Path, out: str | pathlib.Path | None = None, *,
                 placement: str | None = None) -> pathlib.Path:
    """Rewrite a ``torch.save``'d model file (a state dict, or a dict with ``state_dict`` and ``config``) with
    today's keys, in place or to ``out``; every other entry is kept. Returns the path written."""
    path = pathlib.Path(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    config = blob.get("config", {}) if "state_dict" in blob else {}
    placement = placement or config.get("placement")
    if placement is None:
        raise BadValue(f"{path} has no config with a placement; pass placement=")
    state = blob["state_dict"] if "state_dict" in blob else blob
    new = upgrade_state_dict(state, placement, config.get("n_layers"))
    blob = {**blob, "state_dict": new} if "state_dict" in blob else new
    target = pathlib.Path(out) if out is not None else path
    written.replace_whole(target, lambda tmp: torch.save(blob, tmp))
    return target
