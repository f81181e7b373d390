"""EEND-style model: a normlab encoder over frame features, one sigmoid per speaker."""
from __future__ import annotations

import pathlib
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..conformer import ConformerEncoder
from ..encoder import TransformerEncoder


@dataclass(frozen=True)
class ModelConfig:
    input_dim: int = 345  # spliced log-mel (23 x 15)
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    n_speakers: int = 2
    norm: str = "layernorm"
    placement: str = "pre"  # the lesson's Pre-Norm
    encoder: str = "transformer"  # or "conformer"
    dropout: float = 0.1


class EENDModel(nn.Module):
    """``features (batch, frames, input_dim) -> logits (batch, frames, speakers)``; no positional encoding (EEND)."""

    def __init__(self, cfg: ModelConfig = ModelConfig()):
        super().__init__()
        self.cfg = cfg
        if cfg.encoder == "transformer":
            self.encoder = TransformerEncoder(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, norm=cfg.norm,
                                              placement=cfg.placement, dropout=cfg.dropout,
                                              input_dim=cfg.input_dim, pos="none")
        elif cfg.encoder == "conformer":
            self.encoder = ConformerEncoder(cfg.input_dim, cfg.d_model, cfg.n_heads, cfg.n_layers, d_ff=cfg.d_ff,
                                            dropout=cfg.dropout, norm=cfg.norm)
        else:
            raise ValueError(f"unknown encoder {cfg.encoder!r}; valid: transformer, conformer")
        self.head = nn.Linear(cfg.d_model, cfg.n_speakers)

    def forward(self, feats: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(feats, key_padding_mask))  # B, T, S

    def save(self, path: str | pathlib.Path) -> None:
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "EENDModel":
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model = cls(ModelConfig(**blob["config"]))
        model.load_state_dict(blob["state_dict"])
        return model.eval()
