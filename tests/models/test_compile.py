"""Opt-in block compilation: modules compiled in place, names, weights, outputs and hooks unchanged."""
import torch

import normlab
from normlab.models import compile_blocks


def test_compile_blocks_compiles_every_block_module_once():
    m = normlab.TransformerEncoder(16, 2, 3, 32)
    blocks = list(m.layers)
    compile_blocks(m)
    first = [layer._compiled_call_impl for layer in m.layers]
    compile_blocks(m)  # idempotent
    assert all(f is not None for f in first) and [layer._compiled_call_impl for layer in m.layers] == first
    assert list(m.layers) == blocks  # the same modules, compiled in place: no wrapper, no renamed keys
    assert not any("forward" in vars(layer) for layer in m.layers)  # no method patched on the instance
    assert set(m.state_dict()) == set(normlab.TransformerEncoder(16, 2, 3, 32).state_dict())


def test_compiled_blocks_give_the_same_outputs_and_run_the_hooks():
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(16, 2, 2, 32).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    seen = []
    m.layers[1].ffn.pre_norm.register_forward_hook(lambda *_: seen.append(1))
    with torch.no_grad():
        want = m(x, pad)
        got = compile_blocks(m)(x, pad)
    torch.testing.assert_close(got[~pad], want[~pad], rtol=1e-5, atol=1e-5)
    assert len(seen) == 2  # the norm's hook ran in the eager call and in the compiled one
