"""Forward hooks fire on every block and every norm of every encoder, exactly once per call, fused kernels on.

Every block and every norm is called as a module (``__call__``). A norm that
no hook watches does the pending residual add itself (``add_layer_norm`` /
``add_rms_norm``); a watched one is called on the stream, as torch's are.
"""
from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

import normlab
from normlab import functional as F
from normlab.diarization import EENDModel, ModelConfig
from normlab.models import Block
from normlab.registry import NORMS, PLACEMENTS, MaskedBatchNorm

D, HEADS, D_FF, N_LAYERS = 8, 2, 16, 4  # 4 layers: mixln has one post layer
MODELS = ["transformer", "conformer", "video-divided", "video-joint", "eend-transformer", "eend-conformer"]
HOOKED_NORMS = [n for n in NORMS if n != "none"]  # layernorm, rmsnorm, scalenorm, dyt, batchnorm
NORM_TYPES = (normlab.LayerNorm, normlab.RMSNorm, normlab.ScaleNorm, normlab.DyT, MaskedBatchNorm)


def _build(kind: str, norm: str, placement: str):
    torch.manual_seed(0)
    where = dict(norm=norm, placement=placement)
    if kind == "transformer":
        return normlab.TransformerEncoder(D, HEADS, N_LAYERS, D_FF, input_dim=5, max_len=6, **where), (2, 6, 5)
    if kind == "conformer":
        m = normlab.ConformerEncoder(D, HEADS, N_LAYERS, D_FF, input_dim=5, max_len=6, kernel_size=3, **where)
        return m, (2, 6, 5)
    if kind.startswith("video"):
        m = normlab.VideoEncoder(D, HEADS, N_LAYERS, D_FF, n_patches=2, attention=kind.split("-")[1], max_frames=3,
                                 **where)
        return m, (2, 3, 2, D)
    cfg = ModelConfig(input_dim=5, d_model=D, n_heads=HEADS, n_layers=N_LAYERS, d_ff=D_FF, encoder=kind.split("-")[1],
                      dropout=0.0, **where)
    return EENDModel(cfg), (2, 6, 5)


def _fused_kernel_calls(monkeypatch) -> Counter:
    """Counts of the fused add+norm functions' calls from now on, by name."""
    kernel_calls = Counter()

    def counted(op):
        def run(*args, **kw):
            kernel_calls[op.__name__] += 1
            return op(*args, **kw)
        return run

    monkeypatch.setattr(F, "add_layer_norm", counted(F.add_layer_norm))
    monkeypatch.setattr(F, "add_rms_norm", counted(F.add_rms_norm))
    return kernel_calls


@pytest.mark.parametrize("norm", HOOKED_NORMS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("kind", MODELS)
def test_a_hook_on_every_block_and_norm_fires_once_per_call(kind, placement, norm, monkeypatch):
    model, shape = _build(kind, norm, placement)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    norms = [m for m in model.modules() if isinstance(m, NORM_TYPES)]
    assert len(blocks) == N_LAYERS and len(norms) >= N_LAYERS
    calls, fused_calls, kernel_calls = Counter(), Counter(), _fused_kernel_calls(monkeypatch)

    def hook(m, _args, kwargs, _out):
        calls[m] += 1
        fused_calls[m] += kwargs.get("residual") is not None

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in blocks + norms]
    x = torch.randn(shape)
    mask = torch.zeros(shape[:2], dtype=torch.bool)
    mask[1, -1] = True
    with torch.no_grad():
        model.train()(x, mask)
        model.eval()(x, mask)
    for h in handles:
        h.remove()
    silent = [n for n, m in model.named_modules() if m in blocks + norms and calls[m] != 2]
    assert not silent, f"{kind} {placement} {norm}: hooks that did not fire once per call: {silent}"
    # a watched norm is called on the stream, as torch's LayerNorm is: never handed the pending add
    assert sum(fused_calls.values()) == 0 and not kernel_calls, kernel_calls


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("kind", MODELS)
def test_norms_no_hook_watches_take_the_pending_add_in_one_fused_kernel(kind, norm, monkeypatch):
    model, shape = _build(kind, norm, "pre")
    kernel_calls = _fused_kernel_calls(monkeypatch)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    handles = [m.register_forward_hook(lambda *a: None) for m in blocks]  # hooks on the blocks only
    with torch.no_grad():
        model.eval()(torch.randn(shape))
    for h in handles:
        h.remove()
    kernel = {"layernorm": "add_layer_norm", "rmsnorm": "add_rms_norm"}[norm]
    assert set(kernel_calls) == {kernel} and kernel_calls[kernel] >= N_LAYERS, kernel_calls


def _norm_first_pair():
    """A torch ``TransformerEncoderLayer(norm_first=True)`` stack of 2 and normlab's copy of it."""
    from normlab.interop import from_torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    theirs = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    ours = torch.nn.ModuleList([from_torch(block) for block in theirs.layers]).eval()
    return theirs, ours


def _run(ours, x):
    hidden, residual = x, None
    for block in ours:
        hidden, residual = block(hidden, residual)
    return normlab.nn.materialize(hidden, residual)


def test_hooks_on_a_norm_inside_a_model_see_and_change_what_they_would_on_torchs_norm():
    """A norm that took the pending add was called as ``norm(branch, residual=stream)`` and returned ``(y, s)``: a
    hook written for ``torch.nn.LayerNorm`` got a tuple (``o * 0.5`` raised TypeError), recorded the branch
    instead of the stream (3.45 off), and a pre-hook changed the stream itself (0.79 off torch's output)."""
    theirs, ours = _norm_first_pair()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(_run(ours, x), theirs(x), atol=1e-5, rtol=1e-5)
        seen = {}
        for name, norm in (("theirs", theirs.layers[1].norm1), ("ours", ours[1].attn.pre_norm)):
            norm.register_forward_pre_hook(lambda m, args, name=name: seen.__setitem__(name, args[0].clone()))
            norm.register_forward_pre_hook(lambda m, args: (args[0] * 2,))  # LayerNorm ignores the scale
            norm.register_forward_hook(lambda m, args, out: out * 0.5)
        torch.testing.assert_close(_run(ours, x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(seen["ours"], seen["theirs"], atol=1e-5, rtol=1e-5)  # the stream, not the branch


def test_a_hook_on_a_units_add_sees_the_branch_and_the_stream_apart():
    theirs, ours = _norm_first_pair()
    x = torch.randn(2, 5, 16)
    terms = []
    ours[0].ffn.add.register_forward_hook(lambda m, args, out: terms.append((args, out)))
    with torch.no_grad():
        torch.testing.assert_close(_run(ours, x), theirs(x), atol=1e-5, rtol=1e-5)
        (f, stream), s = terms[0]
        h = x + theirs.layers[0]._sa_block(theirs.layers[0].norm1(x), None, None)  # the stream after attention
        torch.testing.assert_close(stream, h, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(f, theirs.layers[0]._ff_block(theirs.layers[0].norm2(h)), atol=1e-5, rtol=1e-5)
        assert torch.equal(s, f + stream)


def test_a_global_forward_hook_sees_every_submodule_in_inference_too():
    """``register_module_forward_hook`` watches every module call: the feed-forward's inference fast path (fc1's
    GEMM with its activation) skipped fc1 under ``no_grad``, so tools built on global hooks missed it."""
    from torch.nn.modules.module import register_module_forward_hook

    from normlab import TransformerEncoder

    torch.manual_seed(0)
    enc = TransformerEncoder(16, 2, 1).eval()
    names = {m: n for n, m in enc.named_modules()}
    x = torch.randn(2, 5, 16)

    def seen_by_a_global_hook(grad: bool) -> set:
        seen = set()
        handle = register_module_forward_hook(lambda m, a, o: seen.add(names.get(m)))
        try:
            with torch.set_grad_enabled(grad):
                enc(x)
        finally:
            handle.remove()
        return seen

    recorded = seen_by_a_global_hook(True)
    assert any(n and n.endswith("fc1") for n in recorded)
    assert seen_by_a_global_hook(False) == recorded


#: modules that are containers and never called: torch's own encoders hold their layers the same way
CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


@pytest.mark.parametrize("kind", MODELS)
def test_a_hook_on_any_submodule_fires_in_train_and_eval_with_and_without_grad(kind):
    """Every submodule but the containers is called as a module in every mode, so a hook on it fires: the
    dropouts were skipped where they change nothing (eval mode, p = 0), and a hook on one never fired."""
    model, shape = _build(kind, "layernorm", "pre")
    watched = {m: n for n, m in model.named_modules() if n and not isinstance(m, CONTAINERS)}
    x = torch.randn(shape)
    for training in (True, False):
        for grad in (True, False):
            calls = Counter()
            handles = [m.register_forward_hook(lambda m, a, o, calls=calls: calls.update([m])) for m in watched]
            with torch.set_grad_enabled(grad):
                model.train(training)(x)
            for h in handles:
                h.remove()
            silent = sorted(n for m, n in watched.items() if not calls[m])
            assert not silent, f"{kind}, training={training}, grad={grad}: hooks that never fired on {silent}"


@pytest.mark.parametrize("kind", MODELS)
def test_a_backward_hook_on_any_submodule_fires(kind):
    """A full backward hook needs the module's call: the dropouts at p = 0 were skipped when only a backward hook
    (not a forward one) was registered on them, and it never fired."""
    model, shape = _build(kind, "layernorm", "pre")
    model.train()
    watched = {m: n for n, m in model.named_modules() if n and not isinstance(m, CONTAINERS)}
    fired = set()
    handles = [m.register_full_backward_hook(lambda m, gi, go: fired.add(m)) for m in watched]
    x = torch.randn(shape, requires_grad=True)
    out = model(x)
    outs = out if isinstance(out, tuple) else (out,)
    torch.cat([o.reshape(-1) for o in outs if torch.is_tensor(o)]).sum().backward()
    for h in handles:
        h.remove()
    drops = sorted(n for m, n in watched.items() if isinstance(m, torch.nn.Dropout) and m not in fired)
    assert any(isinstance(m, torch.nn.Dropout) for m in watched) and not drops, drops


def test_a_linear_put_in_fc1s_place_runs_its_own_forward_in_inference():
    """The feed-forward's inference fast path read fc1's weight and bias: a subclass with its own forward (a LoRA
    or quantized layer) was ignored under no_grad, and a module without `.bias` raised AttributeError."""
    torch.manual_seed(0)
    block = normlab.TransformerBlock(8, 2).eval()

    class Zero(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 0

    zero = Zero(8, block.ffn.fn.fc1.out_features)
    zero.load_state_dict(block.ffn.fn.fc1.state_dict())
    block.ffn.fn.fc1 = zero
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        fast = normlab.nn.materialize(*block(x))
    torch.testing.assert_close(fast, normlab.nn.materialize(*block(x)).detach())
    block.ffn.fn.fc1 = torch.nn.Sequential(torch.nn.Linear(8, zero.out_features))
    with torch.no_grad():
        assert normlab.nn.materialize(*block(x)).shape == x.shape


def test_a_hook_on_fc1_keeps_fc1s_output_before_the_activation():
    """relu ran in place on fc1's output, so a forward hook that kept it saw the activation's values instead."""
    torch.manual_seed(0)
    block = normlab.TransformerBlock(8, 2, activation="relu").train()
    kept = []
    block.ffn.fn.fc1.register_forward_hook(lambda m, args, out: kept.append(out))
    normlab.nn.materialize(*block(torch.randn(2, 3, 8)))
    assert kept and (kept[0] < 0).any()


def test_relu_runs_in_place_only_on_a_plain_linears_output():
    """With relu, the feed-forward ran relu_ on whatever fc1 returned: an Identity in fc1's place (d_ff = d_model)
    handed it the residual stream itself, which it overwrote (a Post-Norm block's output then differed from the
    formula by 1.5), and a Sigmoid after the Linear had its saved output changed (backward raised)."""
    torch.manual_seed(0)
    block = normlab.TransformerBlock(8, 2, 8, activation="relu", placement="post").train()
    block.ffn.fn.fc1 = torch.nn.Identity()
    x = torch.randn(2, 3, 8)
    h = block.attn.post_norm(x + block.attn.fn(x))  # the written formula, as torch computes it
    f = block.ffn.fn.fc2(torch.relu(h))
    torch.testing.assert_close(normlab.nn.materialize(*block(x)), block.ffn.post_norm(h + f))
    block.ffn.fn.fc1 = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid())
    normlab.nn.materialize(*block(x)).sum().backward()


def test_a_trainable_fc1_bias_alone_still_trains():
    """The inference fast path (no autograd formula) ran when only fc1's bias needed a gradient (BitFit-style
    fine-tuning of biases): backward raised "derivative for aten::_addmm_activation is not implemented"."""
    for activation in ("relu", "gelu"):
        enc = normlab.TransformerEncoder(8, 2, 1, 16, activation=activation)
        for name, p in enc.named_parameters():
            p.requires_grad_(name == "layers.0.ffn.fn.fc1.bias")
        enc(torch.randn(2, 3, 8)).sum().backward()
        assert enc.layers[0].ffn.fn.fc1.bias.grad is not None


def test_a_dropout_swapped_for_identity_runs():
    """Replacing a dropout by nn.Identity() (common PyTorch practice) raised AttributeError: the skip read
    `.p`. Any module in a dropout's place now runs; a plain idle nn.Dropout is still skipped."""
    torch.manual_seed(0)
    block = normlab.TransformerBlock(8, 2, dropout=0.1)
    x = torch.randn(2, 3, 8)
    block.eval()
    want = normlab.nn.materialize(*block(x))
    block.attn.drop = torch.nn.Identity()
    block.ffn.fn.drop = torch.nn.Identity()
    for mode in (block.train, block.eval):
        mode()
        assert normlab.nn.materialize(*block(x)).shape == x.shape
    torch.testing.assert_close(normlab.nn.materialize(*block(x)), want)


def test_a_forward_replaced_on_fc1_runs_with_and_without_grad():
    """accelerate's offloading hooks replace a module's `forward` on the instance: under no_grad the fast path
    skipped the wrapper, so the same model gave other outputs with and without grad."""
    torch.manual_seed(0)
    block = normlab.TransformerBlock(8, 2).eval()
    fc1, calls = block.ffn.fn.fc1, []
    inner = fc1.forward

    def wrapped(x):
        calls.append(1)
        return inner(x) * 0

    fc1.forward = wrapped
    x = torch.randn(2, 3, 8)
    with_grad = normlab.nn.materialize(*block(x)).detach()
    with torch.no_grad():
        without = normlab.nn.materialize(*block(x))
    assert len(calls) == 2
    torch.testing.assert_close(without, with_grad)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_a_norm_whose_forward_is_replaced_with_torchs_signature_gets_the_stream(norm):
    """A norm at a junction takes the pending add itself; a forward replaced on the instance has a signature of
    its own (torch's LayerNorm's: one input), so it is called on the sum, never handed ``residual=``."""
    torch.manual_seed(0)
    model = normlab.TransformerEncoder(16, 2, 2, norm=norm).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = model(x)
    target, seen = model.layers[1].attn.pre_norm, []  # fed by the first layer's pending residual
    inner = target.forward

    def replaced(self, inp):
        seen.append(inp)
        return inner(inp) * 0

    target.forward = types.MethodType(replaced, target)
    first = []
    model.layers[0].register_forward_hook(lambda m, args, out: first.append(normlab.nn.materialize(*out)))
    with torch.no_grad():
        out = model(x)
    assert len(seen) == 1 and torch.equal(seen[0], first[0])  # the first layer's output stream
    assert not torch.allclose(out, want)  # the replacement's output was used
