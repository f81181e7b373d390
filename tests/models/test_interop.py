"""torch TransformerEncoderLayer round trips and BERT checkpoints."""
import json

import pytest
import torch
from torch import nn

import normlab
from normlab import interop
from normlab._checks import UserError
from normlab.nn.residual import materialize


def _mask(b, t, lengths):
    m = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        m[i, n:] = True
    return m


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_from_torch_matches(norm_first, activation, with_mask):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))  # non-trivial norms and biases
    block = interop.from_torch(layer)
    assert block.placement == ("pre" if norm_first else "post")
    x = torch.randn(3, 7, 32)
    mask = _mask(3, 7, [7, 4, 2]) if with_mask else None
    layer.train()  # torch's eval fast path zeroes padded outputs; compare the plain math
    block.train()
    ref = layer(x, src_key_padding_mask=mask)
    got = materialize(*block(x, mask=mask))
    valid = ~mask if mask is not None else torch.ones(3, 7, dtype=torch.bool)
    torch.testing.assert_close(got[valid], ref[valid], rtol=1e-5, atol=1e-5)
    back = interop.to_torch(block)
    torch.testing.assert_close(back(x, src_key_padding_mask=mask)[valid], ref[valid], rtol=1e-5, atol=1e-5)
    assert back.norm_first == norm_first


def test_to_torch_rejects_what_torch_lacks():
    with pytest.raises(ValueError, match="placement"):
        interop.to_torch(normlab.TransformerBlock(8, 2, placement="sandwich"))
    with pytest.raises(ValueError, match="LayerNorm"):
        interop.to_torch(normlab.TransformerBlock(8, 2, norm="rmsnorm"))
    with pytest.raises(TypeError):
        interop.from_torch(nn.Linear(2, 2))
    # what the torch layer would compute differently: refused rather than converted to another function
    with pytest.raises(ValueError, match="causal"):
        interop.to_torch(normlab.TransformerBlock(8, 2, causal=True))
    with pytest.raises(ValueError, match="one dropout"):
        interop.to_torch(normlab.TransformerBlock(8, 2, dropout=0.1, attn_dropout=0.0))
    bert_like = normlab.TransformerBlock(8, 2, dropout=0.1)  # BERT's blocks: no dropout inside the feed-forward
    bert_like.ffn.fn.drop.p = 0.0
    with pytest.raises(ValueError, match="one dropout.* 0.0 after the feed-forward's activation"):
        interop.to_torch(bert_like)
    branch = normlab.TransformerBlock(8, 2, dropout=0.1)  # the feed-forward branch's own rate (torch's dropout2)
    branch.ffn.drop.p = 0.5
    with pytest.raises(ValueError, match="one dropout.* 0.5 on its feed-forward branch"):
        interop.to_torch(branch)
    with pytest.raises(ValueError, match="norms have a weight"):
        interop.to_torch(normlab.TransformerBlock(8, 2, norm_kw={"bias": False}))
    with pytest.raises(ValueError, match="unsupported activation"):
        interop.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation=nn.GELU(approximate="tanh"),
                                                      batch_first=True))
    # what is not a layer or block of the kind, or whose norms cannot carry over: one clear error each
    with pytest.raises(TypeError, match="TransformerBlock"):
        interop.to_torch(nn.LayerNorm(8))
    for slot, norm in (("norm1", nn.LayerNorm(8, elementwise_affine=False)), ("norm2", nn.LayerNorm(8, bias=False)),
                       ("norm1", nn.RMSNorm(8))):
        layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        setattr(layer, slot, norm)
        with pytest.raises(ValueError, match="two norms are torch.nn.LayerNorm"):
            interop.from_torch(layer)


def test_from_torch_keeps_each_norms_eps():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True).eval()
    layer.norm2.eps = 1.0
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(materialize(*interop.from_torch(layer)(x)), layer(x), rtol=1e-5, atol=1e-5)
    back = interop.to_torch(interop.from_torch(layer)).eval()  # the way back kept only the first norm's eps
    assert (back.norm1.eps, back.norm2.eps) == (layer.norm1.eps, 1.0)
    torch.testing.assert_close(back(x * 0.01), layer(x * 0.01), rtol=1e-5, atol=1e-5)


def _tiny_bert(tmp_path, safe=True, prefix_model=False):
    transformers = pytest.importorskip("transformers", reason="the BERT comparisons need transformers ([dev] extra)")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = (transformers.BertForMaskedLM if prefix_model else transformers.BertModel)(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "LayerNorm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path, safe_serialization=safe)
    return model


@pytest.mark.parametrize("safe", [True, False])
def test_load_bert_matches_transformers(tmp_path, safe):
    hf = _tiny_bert(tmp_path, safe)
    ours = interop.load_bert(tmp_path)
    ids = torch.randint(1, 99, (2, 11))
    am = torch.ones(2, 11, dtype=torch.long)
    am[1, 6:] = 0
    with torch.no_grad():
        for mask in (None, am):
            ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            got = ours(ids, mask)
            valid = torch.ones(2, 11, dtype=torch.bool) if mask is None else mask.bool()
            torch.testing.assert_close(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
    assert ours.encoder.placement_name == "post" and ours.emb_norm.eps == 1e-12


def test_load_bert_with_prefix_and_errors(tmp_path):
    hf = _tiny_bert(tmp_path, prefix_model=True)
    ours = interop.load_bert(tmp_path)
    ids = torch.randint(1, 99, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf.bert(input_ids=ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    with pytest.raises(FileNotFoundError, match="config.json"):
        interop.load_bert(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(hf.config.to_dict()))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        interop.load_bert(empty)
    (empty / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read as torch weights"):
        interop.load_bert(empty)
    (empty / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(ValueError, match="cannot be read as safetensors"):
        interop.load_bert(empty)
    for text, says in (("{not json", "cannot be read as JSON"), ('{"hidden_size": 8}', "lacks num_attention_heads")):
        (empty / "config.json").write_text(text)
        with pytest.raises(ValueError, match=says):
            interop.load_bert(empty)


def test_load_bert_as_a_decoder_attends_backwards(tmp_path):
    """is_decoder (BertLMHeadModel's configs) was ignored: attention ran both ways, 0.053 off transformers."""
    transformers = pytest.importorskip("transformers", reason="the BERT comparisons need transformers ([dev] extra)")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=20, is_decoder=True)
    hf = transformers.BertModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(3, 50, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(interop.load_bert(tmp_path)(ids), hf(input_ids=ids).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)


def test_load_bert_refuses_what_it_would_read_wrong(tmp_path):
    """A RoBERTa checkpoint (BERT's keys, positions from pad_token_id + 1) loaded and read 3.0 off; more layers in
    the weights than the config names were dropped; a config that disagrees with the weights' shapes raised
    load_state_dict's RuntimeError, and a pad_token_id past the vocabulary an AssertionError."""
    hf = _tiny_bert(tmp_path)  # 3 layers, intermediate 37, 64 positions, vocabulary 99
    config = hf.config.to_dict()
    for change, says in (({"model_type": "roberta"}, "model_type 'roberta' is not BERT"),
                         ({"add_cross_attention": True}, "cross-attention"),
                         ({"num_hidden_layers": 2}, "the weights hold 3 layers, its config.json says"),
                         ({"intermediate_size": 40}, r"intermediate.dense.weight is \[37, 32\], the config makes it "
                                                     r"\[40, 32\]"),
                         ({"max_position_embeddings": 8}, r"position_embeddings.weight is \[64, 32\]"),
                         ({"pad_token_id": 99}, r"pad_token_id must be a token id in \[0, 99\)"),
                         ({"layer_norm_eps": "1e-12"}, "config.json: eps must be")):
        (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UserError, match=says):
            interop.load_bert(tmp_path)


def test_load_bert_reads_gamma_and_beta(tmp_path):
    """Checkpoints converted from TensorFlow name the LayerNorms' parameters gamma and beta; transformers reads
    them, normlab refused them as "not a BERT checkpoint"."""
    from normlab.models.bert import _read_weights

    hf = _tiny_bert(tmp_path)
    state = _read_weights(tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    assert sum(".gamma" in k for k in old) == 7
    torch.save(old, tmp_path / "pytorch_model.bin")
    ids = torch.randint(1, 99, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(interop.load_bert(tmp_path)(ids), hf(input_ids=ids).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)


def test_load_bert_keeps_the_configs_dropout(tmp_path):
    """Every dropout was 0 whatever the config said: fine-tuning a loaded BERT ran without dropout."""
    _tiny_bert(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = interop.load_bert(tmp_path)
    layer = ours.encoder.layers[0]
    assert ours.encoder.drop.p == 0.2  # on the embeddings, after their norm
    assert (layer.attn.drop.p, layer.attn.fn.dropout, layer.ffn.drop.p, layer.ffn.fn.drop.p) == (0.2, 0.3, 0.2, 0.0)
    ids = torch.randint(1, 99, (2, 7))
    ours.train()
    assert not torch.equal(ours(ids), ours(ids))
    ours.eval()
    assert torch.equal(ours(ids), ours(ids))


def test_under_autocast_the_residual_stream_stays_float32_as_in_torch():
    """The fused add + norm returned the stream in the branch's dtype: under bfloat16 autocast every block after
    the first rounded the float32 stream to bfloat16 (5.6x torch's error over 6 layers, a bfloat16 output)."""
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True).eval()
              for _ in range(6)]
    final = nn.LayerNorm(32).eval()
    ours = normlab.TransformerEncoder(32, 4, 6, 64, placement="pre", pos="none", activation="relu").eval()
    for mine, layer in zip(ours.layers, layers):
        mine.load_state_dict(interop.from_torch(layer).state_dict())
    ours.final_norm.load_state_dict(final.state_dict())

    def theirs(x):
        for layer in layers:
            x = layer(x)
        return final(x)

    x = torch.randn(2, 9, 32) * 3 + 0.5
    # autograd recording: torch's layer under no_grad takes its fused fast path, whose dtypes differ
    exact_ours, exact_theirs = ours(x).detach(), theirs(x).detach()
    torch.testing.assert_close(exact_ours, exact_theirs, rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed_ours, mixed_theirs = ours(x).detach(), theirs(x).detach()
    assert mixed_ours.dtype == mixed_theirs.dtype == torch.float32
    err_ours = (mixed_ours - exact_ours).abs().max().item()
    err_theirs = (mixed_theirs - exact_theirs).abs().max().item()
    assert err_ours <= 2 * err_theirs, (err_ours, err_theirs)


def test_from_torch_keeps_each_dropouts_own_rate():
    """torch's layer holds four dropouts, each a module whose rate a user may change; only ``dropout.p`` was read,
    so the other three rates were lost (the converted block trained with other noise)."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
    layer.dropout1.p, layer.self_attn.dropout, layer.dropout.p, layer.dropout2.p = 0.2, 0.3, 0.4, 0.5
    block = interop.from_torch(layer)
    assert (block.attn.drop.p, block.attn.fn.dropout, block.ffn.fn.drop.p, block.ffn.drop.p) == (0.2, 0.3, 0.4, 0.5)
    for rate in (0.0, 0.25):  # one rate throughout: a round trip gives torch's layer back, rates and all
        same = nn.TransformerEncoderLayer(8, 2, 16, dropout=rate, batch_first=True)
        back = interop.to_torch(interop.from_torch(same))
        assert (back.dropout1.p, back.self_attn.dropout, back.dropout.p, back.dropout2.p) == (rate,) * 4


def test_an_additive_attention_mask_is_refused_not_read_inverted():
    """HF's "extended" mask (0 keep, -10000 pad) was read as 0 = padding: every kept token masked, silently."""
    config = {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 16,
              "vocab_size": 20, "max_position_embeddings": 8}
    model = interop.BertEncoder(config).eval()
    ids, keep = torch.randint(1, 20, (2, 6)), torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="attention_mask must hold 1 for a token and 0 for padding"):
        model(ids, (1 - keep).float() * -10000.0)
    with torch.no_grad():  # the 0/1 form, as an integer, a float or a bool mask: one answer
        torch.testing.assert_close(model(ids, keep), model(ids, keep.bool()), rtol=0, atol=0)
        torch.testing.assert_close(model(ids, keep.float()), model(ids, keep.bool()), rtol=0, atol=0)


def test_what_normlab_s_attention_does_not_compute_is_refused_not_converted():
    """add_bias_kv and add_zero_attn were read as plain attention (outputs 0.18 and 0.045 off, silently); kdim/vdim
    and linear maps of which only some had a bias, and an RMSNorm in a block's second slot, failed inside torch."""
    for kw, says in (({"add_bias_kv": True}, "add_bias_kv"), ({"add_zero_attn": True}, "add_zero_attn"),
                     ({"kdim": 4, "vdim": 4}, "kdim/vdim")):
        layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        layer.self_attn = nn.MultiheadAttention(8, 2, batch_first=True, **kw)
        with pytest.raises(ValueError, match=f"unsupported self_attn: {says}"):
            interop.from_torch(layer)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    layer.linear1 = nn.Linear(8, 16, bias=False)
    with pytest.raises(ValueError, match="all have a bias or none.*linear1: False"):
        interop.from_torch(layer)
    block = normlab.TransformerBlock(8, 2)
    block.ffn.pre_norm = normlab.RMSNorm(8)
    with pytest.raises(ValueError, match="torch's layer uses LayerNorm, block uses RMSNorm"):
        interop.to_torch(block)
    block = normlab.TransformerBlock(8, 2)
    block.ffn.fn.fc1 = nn.Linear(8, block.ffn.fn.fc1.out_features, bias=False)
    with pytest.raises(ValueError, match="a bias on all its linear maps or on none.*fc1: False"):
        interop.to_torch(block)


@pytest.mark.parametrize("key, value", [("hidden_size", "8"), ("vocab_size", 0), ("type_vocab_size", -1)])
def test_a_bert_config_of_wrong_sizes_names_its_key(key, value):
    """hidden_size "8" failed in torch.empty, vocab_size 0 with an IndexError at padding_idx."""
    config = {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 16,
              "vocab_size": 20, "max_position_embeddings": 8, key: value}
    with pytest.raises(ValueError, match=f"the config's {key} must be a whole number >= 1"):
        interop.BertEncoder(config)


def test_load_bert_reads_safetensors_without_the_safetensors_package(tmp_path, monkeypatch):
    """A wheel installed with its user extras has no `safetensors` package: load_bert refused model.safetensors,
    the format transformers writes by default, though normlab reads the format itself."""
    import sys

    hf = _tiny_bert(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors: ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    ids = torch.randint(1, 99, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(interop.load_bert(tmp_path)(ids), hf(input_ids=ids).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)
