"""BERT-family checkpoints as a normlab Post-Norm encoder.

Reads a directory in the usual layout (``config.json`` plus
``model.safetensors`` or ``pytorch_model.bin``; keys with or without a
``bert.`` prefix) into :class:`BertEncoder`: word + position + token-type
embeddings, an embedding LayerNorm, then ``num_hidden_layers`` Post-Norm
blocks. Nothing is downloaded.
"""
from __future__ import annotations

import json
import pathlib
import pickle
import re

import torch
from torch import nn

from .._checks import BadType, BadValue, NotFound, check_count
from ..kernels.dispatch import values_known
from ..norms import LayerNorm
from ..safetensors_file import read_safetensors
from .transformer import TransformerEncoder

#: what a BERT config must say (the rest has BERT's defaults)
_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                "max_position_embeddings")


class BertEncoder(nn.Module):
    """BERT's encoder; ``forward(input_ids, attention_mask=None, token_type_ids=None)`` -> last hidden states."""

    def __init__(self, config: dict):
        super().__init__()
        lacking = [k for k in _CONFIG_KEYS if k not in config]
        if lacking:
            raise BadValue(f"not a BERT config: it lacks {', '.join(lacking)}")
        kind = config.get("model_type", "bert")  # (Google's original configs name none)
        if kind != "bert":  # RoBERTa's keys are BERT's, but its positions start at pad_token_id + 1: 3.0 off
            raise BadValue(f"model_type {kind!r} is not BERT: its embeddings differ (RoBERTa and its kin count "
                           "positions from pad_token_id + 1); load_bert reads model_type 'bert'")
        if config.get("add_cross_attention"):
            raise BadValue("add_cross_attention: a decoder's cross-attention is not part of this encoder")
        for key in ("hidden_size", "vocab_size", "max_position_embeddings", "type_vocab_size"):  # (torch's
            if key in config:  # "empty(): argument 'size' failed to unpack", an IndexError at padding_idx)
                check_count(config[key], f"the config's {key}")
        d, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
        act = config.get("hidden_act", "gelu")
        if act not in ("gelu", "relu"):
            raise BadValue(f"unsupported hidden_act {act!r}: gelu or relu")
        pos = config.get("position_embedding_type", "absolute")
        if pos != "absolute":  # relative distances need weights and attention terms this encoder does not have
            raise BadValue(f"unsupported position_embedding_type {pos!r}: absolute")
        pad = config.get("pad_token_id", 0)
        if pad is not None and (type(pad) is not int or not 0 <= pad < config["vocab_size"]):
            raise BadValue(f"pad_token_id must be a token id in [0, {config['vocab_size']}) (vocab_size) or null, got "
                           f"{pad!r}")
        self.config = config
        self.word_embeddings = nn.Embedding(config["vocab_size"], d, padding_idx=pad)
        self.position_embeddings = nn.Embedding(config["max_position_embeddings"], d)
        self.token_type_embeddings = nn.Embedding(config.get("type_vocab_size", 2), d)
        self.emb_norm = LayerNorm(d, eps=eps)
        # BERT's dropouts (its defaults 0.1): on the embeddings (the encoder's input dropout), on each branch
        # before its add, and on the attention probabilities; none after the FFN's activation
        hidden, probs = config.get("hidden_dropout_prob", 0.1), config.get("attention_probs_dropout_prob", 0.1)
        # is_decoder (BertLMHeadModel's configs): each token attends to itself and the tokens before it
        self.encoder = TransformerEncoder(
            d, config["num_attention_heads"], config["num_hidden_layers"], config["intermediate_size"],
            norm="layernorm", placement="post", pos="none", activation=act, norm_kw={"eps": eps},
            dropout=hidden, attn_dropout=probs, causal=config.get("is_decoder") is True,
        )
        for layer in self.encoder.layers:
            layer.ffn.fn.drop.p = 0.0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        _check_ids(input_ids, "input_ids", self.word_embeddings.num_embeddings, "vocab_size")
        b, t = input_ids.shape
        if t > self.position_embeddings.num_embeddings:
            raise BadValue(f"{t} tokens is more than this model's {self.position_embeddings.num_embeddings} "
                           "positions (max_position_embeddings)")
        if token_type_ids is not None:
            _check_ids(token_type_ids, "token_type_ids", self.token_type_embeddings.num_embeddings, "type_vocab_size")
            if token_type_ids.shape != input_ids.shape:
                raise BadValue(f"token_type_ids {list(token_type_ids.shape)} must match input_ids {[b, t]}")
        pos = torch.arange(t, device=input_ids.device)
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        h = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(types)
        h = self.emb_norm(h)  # B, T, D
        m = attention_mask
        if isinstance(m, torch.Tensor) and m.dtype != torch.bool and values_known(m) and bool(((m != 0) & (m != 1))
                                                                                          .any()):
            # an additive mask (0 keep, -10000 pad: HF's "extended" form) read as 0 = padding inverted every token
            raise BadValue("attention_mask must hold 1 for a token and 0 for padding (or be a bool tensor); an "
                           "additive mask (0 keep, -10000 pad) is another form: pass (mask == 0) instead")
        pad = None if attention_mask is None else attention_mask == 0  # B, T   True = padding
        return self.encoder(h, pad)  # B, T, D


def _check_ids(ids, name: str, size: int, what: str) -> None:
    """BadValue unless ``ids`` is an int32/int64 ``(B, T)`` tensor of indices below ``size`` (the config's ``what``)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        got = f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise BadValue(f"{name} must be an int64 or int32 tensor (B, T), got {got}")
    # the range check reads the values, which a trace cannot (torch.export refused the model)
    if ids.numel() and values_known(ids) and (int(ids.min()) < 0 or int(ids.max()) >= size):
        raise BadValue(f"{name} must lie in [0, {size}) ({what}), got {int(ids.min())}..{int(ids.max())}")


def _bert_key_map(n_layers: int) -> dict[str, tuple[str, ...]]:
    """normlab name -> the BERT names whose tensors, concatenated along dim 0, make it.

    BERT keeps query, key and value as three Linear layers; normlab's fused
    ``qkv_proj`` holds them stacked in that order (rows ``[q; k; v]``).
    """
    m = {
        "word_embeddings.weight": ("embeddings.word_embeddings.weight",),
        "position_embeddings.weight": ("embeddings.position_embeddings.weight",),
        "token_type_embeddings.weight": ("embeddings.token_type_embeddings.weight",),
        "emb_norm.weight": ("embeddings.LayerNorm.weight",),
        "emb_norm.bias": ("embeddings.LayerNorm.bias",),
    }
    parts = {
        "attn.fn.qkv_proj": ("attention.self.query", "attention.self.key", "attention.self.value"),
        "attn.fn.out_proj": ("attention.output.dense",),
        "attn.post_norm": ("attention.output.LayerNorm",),
        "ffn.fn.fc1": ("intermediate.dense",),
        "ffn.fn.fc2": ("output.dense",),
        "ffn.post_norm": ("output.LayerNorm",),
    }
    for i in range(n_layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                m[f"encoder.layers.{i}.{ours}.{p}"] = tuple(f"encoder.layer.{i}.{t}.{p}" for t in theirs)
    return m


def _read_weights(path: pathlib.Path) -> dict[str, torch.Tensor]:
    st, pt = path / "model.safetensors", path / "pytorch_model.bin"
    if st.exists():  # read by normlab itself: the core install has no `safetensors` package
        try:
            return read_safetensors(st)[0]
        except (BadValue, OSError) as e:
            raise BadValue(f"{st} cannot be read as safetensors ({str(e).removeprefix(f'{st} ')[:120]})") from None
    if pt.exists():
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:  # a cut or foreign file
            raise BadValue(f"{pt} cannot be read as torch weights ({type(e).__name__}: {str(e)[:120]})") from None
    raise NotFound(f"{path} has neither model.safetensors nor pytorch_model.bin")


def load_bert(path: str | pathlib.Path) -> BertEncoder:
    """Load a BERT checkpoint directory into a :class:`BertEncoder` (eval mode)."""
    path = pathlib.Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise NotFound(f"{path} has no config.json")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise BadValue(f"{cfg_file} cannot be read as JSON ({str(e)[:120]})") from None
    if not isinstance(config, dict):
        raise BadValue(f"{cfg_file} is not a BERT config (a JSON object)")
    try:
        model = BertEncoder(config)  # the config checked before the weights are read
    except (BadValue, BadType) as e:
        raise type(e)(f"{cfg_file}: {e}") from None
    # older checkpoints name the LayerNorms' parameters gamma and beta (TensorFlow's names)
    renamed = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}
    state = {next((k[: -len(old)] + new for old, new in renamed.items() if k.endswith(old)), k): v
             for k, v in _read_weights(path).items()}
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    mapping = _bert_key_map(config["num_hidden_layers"])
    missing = [t for theirs in mapping.values() for t in theirs if prefix + t not in state]
    if missing:
        raise BadValue(f"{path} is not a BERT checkpoint: it lacks {len(missing)} BERT weights, e.g. {missing[:3]}")
    held = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"encoder\.layer\.(\d+)\.", k))}
    if held and max(held) + 1 > config["num_hidden_layers"]:  # the extra layers were dropped without a word
        raise BadValue(f"{path}: the weights hold {max(held) + 1} layers, its config.json says num_hidden_layers "
                       f"{config['num_hidden_layers']}")
    weights = {ours: torch.cat([state[prefix + t] for t in theirs]) for ours, theirs in mapping.items()}
    shapes = model.state_dict()
    for ours, theirs in mapping.items():  # (load_state_dict's RuntimeError listed every mismatch as a bug)
        if weights[ours].shape != shapes[ours].shape:
            names = prefix + theirs[0] + ("" if len(theirs) == 1 else f" (stacked with {len(theirs) - 1} more)")
            raise BadValue(f"{path}: config.json and the weights disagree: {names} is {list(weights[ours].shape)}, "
                           f"the config makes it {list(shapes[ours].shape)}")
    model.load_state_dict(weights)
    return model.eval()
