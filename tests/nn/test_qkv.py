"""The fused QKV projection: init, DeepNorm, and the ways weights load into it (old files: test_old_keys.py)."""
import json

import pytest
import torch
from torch import nn

import normlab
from normlab import interop
from normlab.diarization import SHIPPED, EENDModel
from normlab.models.bert import BertEncoder
from normlab.nn.attention import MultiHeadSelfAttention


def test_fused_init_draws_what_three_linears_drew():
    torch.manual_seed(3)
    q, k, v = (nn.Linear(24, 24) for _ in range(3))
    torch.manual_seed(3)
    a = MultiHeadSelfAttention(24, 4)
    assert torch.equal(a.qkv_proj.weight, torch.cat([q.weight, k.weight, v.weight]))
    assert torch.equal(a.qkv_proj.bias, torch.cat([q.bias, k.bias, v.bias]))


def test_views_are_the_fused_rows():
    a = MultiHeadSelfAttention(16, 2)
    d = 16
    for i, view in enumerate((a.q_proj, a.k_proj, a.v_proj)):
        assert view.weight.shape == (d, d) and view.in_features == view.out_features == d
        assert torch.equal(view.weight, a.qkv_proj.weight[i * d:(i + 1) * d])
    with torch.no_grad():
        a.k_proj.weight.zero_()
    assert a.qkv_proj.weight[d:2 * d].abs().sum() == 0 and a.qkv_proj.weight[:d].abs().sum() > 0


def test_deepnorm_scales_only_v_and_out_rows_exactly():
    torch.manual_seed(0)
    deep = normlab.TransformerBlock(32, 4, 64, placement="deepnorm", n_layers=6)
    torch.manual_seed(0)
    plain = normlab.TransformerBlock(32, 4, 64, placement="post", n_layers=6)
    beta = (8 * 6) ** -0.25
    dq, pq = deep.attn.fn.qkv_proj.weight.detach(), plain.attn.fn.qkv_proj.weight.detach()
    assert torch.equal(dq[:64], pq[:64])  # q and k rows: gain 1
    torch.testing.assert_close(dq[64:], pq[64:] * beta, rtol=0, atol=0)  # v rows scaled by beta
    torch.testing.assert_close(deep.attn.fn.out_proj.weight, plain.attn.fn.out_proj.weight * beta, rtol=0, atol=0)


def test_from_torch_and_to_torch_move_in_proj_rows_unchanged():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    block = interop.from_torch(layer)
    assert torch.equal(block.attn.fn.qkv_proj.weight, layer.self_attn.in_proj_weight)
    assert torch.equal(block.attn.fn.qkv_proj.bias, layer.self_attn.in_proj_bias)
    assert torch.equal(block.attn.fn.q_proj.weight, layer.self_attn.in_proj_weight[:32])
    back = interop.to_torch(block)
    for (n, p), (n2, p2) in zip(layer.state_dict().items(), back.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n


def test_bert_style_separate_qkv_loads(tmp_path):
    """A checkpoint in BERT's layout (query/key/value apart) loads into the fused projection, in order."""
    cfg = {"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 48, "max_position_embeddings": 40, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    torch.manual_seed(4)
    src = BertEncoder(cfg).eval()
    names = {"word_embeddings": "embeddings.word_embeddings", "position_embeddings": "embeddings.position_embeddings",
             "token_type_embeddings": "embeddings.token_type_embeddings", "emb_norm": "embeddings.LayerNorm"}
    parts = {"attn.fn.out_proj": "attention.output.dense", "attn.post_norm": "attention.output.LayerNorm",
             "ffn.fn.fc1": "intermediate.dense", "ffn.fn.fc2": "output.dense", "ffn.post_norm": "output.LayerNorm"}
    state = {}
    for key, t in src.state_dict().items():
        head, _, leaf = key.rpartition(".")
        if head in names:
            state[f"bert.{names[head]}.{leaf}"] = t
            continue
        i = int(key.split(".")[2])
        rest = head.split(".", 3)[3]
        if rest == "attn.fn.qkv_proj":
            for name, part in zip(("query", "key", "value"), t.chunk(3)):
                state[f"bert.encoder.layer.{i}.attention.self.{name}.{leaf}"] = part.clone()
        else:
            state[f"bert.encoder.layer.{i}.{parts[rest]}.{leaf}"] = t
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    torch.save(state, tmp_path / "pytorch_model.bin")
    got = interop.load_bert(tmp_path)
    for (n, p), p2 in zip(src.state_dict().items(), got.state_dict().values()):
        assert torch.equal(p, p2), n
    ids = torch.randint(1, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(got(ids), src(ids))


def test_shipped_diarization_model_has_the_fused_keys():
    if not SHIPPED.is_file():
        pytest.skip("the package was installed without its model file")
    raw = torch.load(SHIPPED, map_location="cpu", weights_only=True)["state_dict"]
    model = EENDModel.load()
    assert set(raw) == set(model.state_dict())  # today's keys: nothing renamed on load
    for i, layer in enumerate(model.encoder.layers):
        assert torch.equal(layer.attn.fn.qkv_proj.weight, raw[f"encoder.layers.{i}.attn.fn.qkv_proj.weight"])
    # same outputs as torch's own layers carrying those weights (an attention written independently)
    enc = model.encoder
    layers = [interop.to_torch(b).eval() for b in enc.layers]
    torch.manual_seed(0)
    x = torch.randn(2, 60, model.cfg.input_dim)
    pad = torch.zeros(2, 60, dtype=torch.bool)
    pad[1, 41:] = True
    with torch.no_grad():
        got = enc(x, pad)
        h = enc.pos(enc.input_proj(x))
        for layer in layers:  # eval: torch's fused fast path; padded rows differ, valid rows must not
            h = layer(h, src_key_padding_mask=pad)
        ref = enc.final_norm(h)
    torch.testing.assert_close(got[~pad], ref[~pad], rtol=1e-5, atol=1e-5)
