"""State dicts with older normlab keys: one clear error naming the converter, and the converter."""
from __future__ import annotations

import pytest
import torch

import normlab
from normlab.diarization import EENDModel, ModelConfig
from normlab.models import OldKeysError, upgrade_file, upgrade_state_dict


def _old_layout(state: dict) -> dict:
    """``state`` as older files store it: q/k/v projections apart, each unit's norm under ``norm``."""
    out = {}
    for key, t in state.items():
        if ".qkv_proj." in key:
            for name, part in zip("qkv", t.chunk(3)):
                out[key.replace("qkv_proj", f"{name}_proj")] = part.clone()
        else:
            out[key.replace(".pre_norm.", ".norm.").replace(".post_norm.", ".norm.")] = t
    return out


@pytest.mark.parametrize("placement", ["pre", "post", "mixln"])
def test_old_keys_are_refused_naming_the_fix_and_upgrade_bitwise(placement):
    torch.manual_seed(2)
    src = normlab.TransformerEncoder(32, 4, 4, 64, placement=placement).eval()
    old = _old_layout(src.state_dict())
    assert "layers.0.attn.fn.q_proj.weight" in old and "layers.0.attn.norm.weight" in old
    dst = normlab.TransformerEncoder(32, 4, 4, 64, placement=placement).eval()
    with pytest.raises(OldKeysError, match=r"normlab\.models\.upgrade_file"):
        dst.load_state_dict(old)
    dst.load_state_dict(upgrade_state_dict(old, placement))  # strict: nothing missing, nothing unexpected
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))


def _fuse_qkv(module, state_dict, prefix, *args):
    """A user's load pre-hook converting the old q/k/v keys of one attention module, as torch's docs suggest."""
    for leaf in ("weight", "bias"):
        parts = [state_dict.pop(f"{prefix}{w}_proj.{leaf}", None) for w in "qkv"]
        if all(p is not None for p in parts):
            state_dict[f"{prefix}qkv_proj.{leaf}"] = torch.cat(parts)


@pytest.mark.parametrize("where", ["attention", "encoder"])
def test_a_users_load_pre_hook_converts_old_keys_before_they_are_refused(where):
    torch.manual_seed(3)
    src = normlab.TransformerEncoder(16, 2, 2).eval()
    old = {k: v for k, v in _old_layout(src.state_dict()).items()}
    old = {k.replace(".norm.", ".pre_norm."): v for k, v in old.items()}  # the norms as today: only q/k/v old
    dst = normlab.TransformerEncoder(16, 2, 2).eval()
    if where == "attention":  # torch runs a module's own pre-hooks inside its load, after its parents'
        for layer in dst.layers:
            layer.attn.fn.register_load_state_dict_pre_hook(_fuse_qkv)
    else:
        dst.register_load_state_dict_pre_hook(
            lambda m, sd, prefix, *a: [_fuse_qkv(None, sd, f"{prefix}layers.{i}.attn.fn.") for i in range(2)])
    dst.load_state_dict(old)  # strict: the hook left nothing missing or unexpected
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))


def test_old_keys_beside_a_complete_state_are_left_to_strict():
    src = normlab.TransformerEncoder(16, 2, 2)
    state = {**src.state_dict(), "layers.0.attn.fn.q_proj.weight": torch.zeros(16, 16)}
    dst = normlab.TransformerEncoder(16, 2, 2)
    dst.load_state_dict(state, strict=False)  # nothing of today's layout is missing: an extra key, ignored
    with pytest.raises(RuntimeError, match="Unexpected key.*q_proj"):
        dst.load_state_dict(state)
    with pytest.raises(OldKeysError):  # without strict too: today's keys missing, old ones given
        dst.load_state_dict(_old_layout(src.state_dict()), strict=False)


def test_a_module_of_the_users_named_like_an_old_key_is_not_refused():
    class Attn(torch.nn.Module):  # its own q_proj: a key the stack expects is never "old"
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(8, 8)

        def forward(self, h, mask=None):
            return self.q_proj(h)

    class MyBlock(normlab.models.Block):
        def __init__(self, spec):
            super().__init__(spec)
            self.attn = spec.unit(Attn())

        def forward(self, hidden, residual=None, mask=None):
            return self.attn(hidden, residual, mask)

    a, b = normlab.models.Stack(2, MyBlock, dim=8), normlab.models.Stack(2, MyBlock, dim=8)
    b.load_state_dict(a.state_dict())


def test_an_old_eend_file_errors_once_and_upgrade_file_fixes_it(tmp_path):
    torch.manual_seed(0)
    model = EENDModel(ModelConfig(input_dim=8, d_model=16, n_heads=2, n_layers=2, d_ff=32, placement="post")).eval()
    model.postprocess["threshold"] = 0.7
    path = tmp_path / "old.pt"
    model.save(path)
    blob = torch.load(path, weights_only=True)
    torch.save({**blob, "state_dict": _old_layout(blob["state_dict"])}, path)
    with pytest.raises(ValueError, match=r"upgrade_file\(path\)"):
        EENDModel.load(path)
    assert upgrade_file(path) == path
    again = EENDModel.load(path)
    assert again.postprocess["threshold"] == 0.7  # every entry but the state dict kept
    assert torch.load(path, weights_only=True)["provenance"] == blob["provenance"]
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_loading_runs_no_state_dict_hook():
    """A Stack's load looked for old keys by building its own state_dict(), which ran the user's state-dict
    hooks (and built every entry) on each load; torch's modules run none there."""
    a, b = normlab.TransformerEncoder(8, 2, 2), normlab.TransformerEncoder(8, 2, 2)
    state, fired = a.state_dict(), []
    b.register_state_dict_pre_hook(lambda *args: fired.append("pre"))
    b._register_state_dict_hook(lambda *args: fired.append("post"))
    b.load_state_dict(state)
    assert fired == []
    torch.testing.assert_close(b(torch.ones(1, 3, 8)), a(torch.ones(1, 3, 8)))
