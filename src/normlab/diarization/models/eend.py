"""EEND-style model: a normlab encoder over frame features; one sigmoid per speaker, or a powerset softmax."""
from __future__ import annotations

import os
import pathlib
import pickle
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ... import written
from ..._checks import BadType, BadValue, NotFound, check_choice, check_count, check_rate
from ...models.conformer import ConformerEncoder
from ...models.transformer import TransformerEncoder
from ...nn.constants import DeviceConstant
from ..io.features import FeatureConfig
from .powerset import marginals, subsets

#: the most local speakers a model may have: its loss tries every order of them, and the pipeline reads up to this
MAX_LOCAL_SPEAKERS = 8


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
    dropout: float = 0.1  # FFN hidden and branch outputs
    attn_dropout: float = 0.0  # on attention probabilities (0: half the training time on CPU)
    head: str = "multilabel"  # one sigmoid per speaker (EEND), or "powerset": a softmax over speaker sets
    max_active: int = 2  # powerset: the most speakers one frame's class can hold

    def __post_init__(self):
        # sizes and rates a model cannot be built on fail here, not deep in attention at the first step
        for name in ("input_dim", "d_model", "n_heads", "n_layers", "d_ff", "n_speakers"):
            check_count(getattr(self, name), name)
        if self.n_speakers > MAX_LOCAL_SPEAKERS:  # the loss tries every order of them (n!): 9 would take GBs a step
            raise BadValue(f"n_speakers is at most {MAX_LOCAL_SPEAKERS} (the pipeline's limit on local speakers), "
                           f"got {self.n_speakers}")
        if self.d_model % self.n_heads:
            raise BadValue(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        for name in ("dropout", "attn_dropout"):
            check_rate(getattr(self, name), name)


#: encoders an EEND model can be built on
ENCODERS = ("transformer", "conformer")
#: output heads: multi-label PIT (EEND) or powerset (Plaquet & Bredin 2023, ``powerset.py``)
HEADS = ("multilabel", "powerset")

#: the model shipped in the package (``normlab diarize recipe`` writes it; docs/diarization.md has its numbers)
SHIPPED = pathlib.Path(__file__).parent.parent / "assets" / "eend_real.pt"


def shipped_models() -> list[str]:
    """The names of the model files shipped in the package (``eend_real``, the default, and the others)."""
    return sorted(f.stem for f in SHIPPED.parent.glob("eend*.pt"))


def model_path(model: str | os.PathLike | None) -> pathlib.Path:
    """Where the model ``model`` names is: None, the shipped default; a path to a file, that file; where no file
    of that name exists, a shipped model's name (``eend_local4``, ``eend_local4.pt``, or ``assets/eend_local4.pt``
    as the docs write it), the package's own file; else the path as given (which then names no file)."""
    if model is None:
        return SHIPPED
    path = pathlib.Path(model)
    if path.exists() or str(path.parent) not in (".", "assets"):
        return path
    own = SHIPPED.parent / (path.name if path.suffix == ".pt" else path.name + ".pt")
    return own if own.stem in shipped_models() else path


#: post-processing used when a model file does not carry its own (EEND's defaults)
DEFAULT_POSTPROCESS = {"threshold": 0.5, "median": 11}


#: the tables of settings a model file's ``postprocess`` may hold (PipelineConfig.for_model reads them), each with
#: how many levels of keys lie above its settings: ``modes[mode]``, ``encoders[encoder][mode]``...
SETTINGS_TABLES = {"modes": 1, "vad_speech": 0, "whitened": 1, "ahc": 1, "vbx": 1, "encoders": 2}


def settings_problem(post) -> str | None:
    """Why a model file's ``postprocess`` cannot be read as its stored settings ("are not a table...", "hold
    ..."), or None. A table holding text where its settings go stopped a run that read it with an
    AttributeError."""
    def nested(v, levels: int) -> bool:
        return isinstance(v, dict) and (levels == 0 or all(nested(x, levels - 1) for x in v.values()))

    if not isinstance(post, dict):
        return "are not a table of settings"
    bad = next((name for name, levels in SETTINGS_TABLES.items() if name in post and not nested(post[name], levels)),
               None)
    return None if bad is None else f"hold a {bad!r} that is not a table of settings"


class EENDModel(nn.Module):
    """``features (batch, frames, input_dim) -> logits (batch, frames, outputs)``; no positional encoding (EEND).

    The outputs are one logit per local speaker (``head="multilabel"``) or one
    per set of speakers (``"powerset"``); :meth:`activity` gives speaker
    probabilities ``(batch, frames, speakers)`` for either.

    ``postprocess`` (threshold, median filter width) travels with the saved
    model: it is chosen on a development set for these weights. So does
    ``features``, the feature setup it was trained on (files without it: the
    default ``FeatureConfig``). So does ``whitening`` where one was fitted: the
    map of the speaker embeddings learned on this model's training
    conversations (``pipeline/whiten.py``; None without one).
    """

    features: FeatureConfig = FeatureConfig()

    def __init__(self, cfg: ModelConfig = ModelConfig()):
        super().__init__()
        if not isinstance(cfg, ModelConfig):  # EENDModel("model.pt") meant EENDModel.load
            hint = " (a saved model loads with EENDModel.load(path))" if isinstance(cfg, (str, os.PathLike)) else ""
            raise BadType(f"EENDModel takes a ModelConfig, got {type(cfg).__name__}{hint}")
        self.cfg = cfg
        self.postprocess = dict(DEFAULT_POSTPROCESS)
        self.whitening: dict | None = None
        check_choice(cfg.encoder, ENCODERS, "encoder")
        # one signature for every encoder; EEND's Transformer has no positions, the Conformer its sinusoidal table
        encoder, pos = {"transformer": (TransformerEncoder, "none"), "conformer": (ConformerEncoder, "sinusoidal")}[
            cfg.encoder]
        self.encoder = encoder(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, norm=cfg.norm, placement=cfg.placement,
                               dropout=cfg.dropout, attn_dropout=cfg.attn_dropout, input_dim=cfg.input_dim, pos=pos)
        check_choice(cfg.head, HEADS, "output head")
        outputs = cfg.n_speakers
        if cfg.head == "powerset":
            if not 1 <= cfg.max_active <= cfg.n_speakers:
                raise BadValue(f"max_active must be in 1..n_speakers ({cfg.n_speakers}), got {cfg.max_active}")
            table = subsets(cfg.n_speakers, cfg.max_active)
            # C, S: a constant of the config on the CPU, and on the logits' device where read (not a buffer:
            # DeviceConstant says why)
            self.powerset = table
            self._powerset = DeviceConstant(table)
            outputs = table.shape[0]
        self.head = nn.Linear(cfg.d_model, outputs)

    def forward(self, feats: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(feats, key_padding_mask))  # B, T, S (multilabel) or C (powerset)

    def activity(self, feats: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Each local speaker's probability of talking, ``(batch, frames, speakers)``, whatever the head."""
        logits = self(feats, key_padding_mask)
        if self.cfg.head == "multilabel":
            return torch.sigmoid(logits)
        return marginals(logits, self._powerset(logits.device))

    def save(self, path: str | pathlib.Path) -> None:
        """Config, post-processing, features, weights and ``provenance`` (versions, commit, machine), atomically."""
        from ...provenance import record

        blob = {"config": asdict(self.cfg), "postprocess": self.postprocess, "features": asdict(self.features),
                "state_dict": self.state_dict(), "provenance": record(),
                **({"whitening": self.whitening} if self.whitening is not None else {})}
        written.replace_whole(path, lambda tmp: torch.save(blob, tmp))  # (a full disk: said, no temporary left)

    @classmethod
    def load(cls, path: str | pathlib.Path | None = None) -> "EENDModel":
        """Load a saved model; ``None`` loads the one shipped in the package, a shipped model's name
        (:func:`shipped_models`) that one."""
        path = model_path(path)
        if path.is_dir():  # (it read "no model file at DIR")
            raise BadValue(f"{path} is a folder, not a model file" + (f" (give {path / 'model.pt'}, the one in it)"
                                                                      if (path / "model.pt").is_file() else ""))
        if not path.is_file():
            raise NotFound(f"no model file at {path}" + (" (the package was installed without its model; "
                                    "`normlab diarize recipe` trains it)" if path == SHIPPED else
                                    f" (the models shipped with normlab go by name: {', '.join(shipped_models())})"))
        not_ours = f"{path} is not a normlab EEND model file"
        from .weights import is_safetensors

        if is_safetensors(path):
            raise BadValue(f"{not_ours}: it holds bare weights (safetensors), as the speaker encoder's and the VAD's "
                           "files do (a speaker encoder goes with --embedding)")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            if isinstance(e, pickle.UnpicklingError) and "Unsupported global" in str(e):
                # torch's own message suggests running the file's code: normlab never does
                raise BadValue(f"{not_ours}: it holds Python objects, not only tensors and settings (normlab "
                               "reads model files without running code in them)") from None
            # a truncated file, a text file, another format
            raise BadValue(f"{not_ours}: torch cannot read it (truncated, or not written by torch.save)") from None
        if not isinstance(blob, dict) or not {"config", "state_dict"} <= blob.keys():
            raise BadValue(f"{not_ours}: a torch file without a model's config and weights")
        try:
            model = cls(ModelConfig(**blob["config"]))
            model.load_state_dict(blob["state_dict"])
            model.features = FeatureConfig(**blob.get("features", {}))
        except Exception as e:  # a config or weights from elsewhere
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise BadValue(f"{not_ours}: its config or weights do not fit ({type(e).__name__}: {first[:160]})") from e
        bad = [k for k, v in blob["state_dict"].items() if v.is_floating_point() and not bool(v.isfinite().all())]
        if bad:
            raise BadValue(f"{not_ours}: its weights hold NaN or infinite values ({bad[0]}: a diverged training?)")
        post, whitening = blob.get("postprocess", {}), blob.get("whitening")
        damaged = settings_problem(post)
        if damaged:
            raise BadValue(f"{not_ours}: its stored pipeline settings {damaged}")
        if whitening is not None and not isinstance(whitening, dict):
            raise BadValue(f"{not_ours}: its embedding whitening is not a table of tensors")
        from ..pipeline.whiten import stored_problem

        problem = stored_problem(whitening) if whitening is not None else None
        if problem:
            raise BadValue(f"{not_ours}: its {problem}")
        model.postprocess.update(post)
        model.whitening = whitening
        meta = blob.get("meta")
        stopped = meta.get("diverged") if isinstance(meta, dict) else None
        if isinstance(stopped, dict) and isinstance(stopped.get("step"), int):  # read as any model, said once
            import warnings

            warnings.warn(f"{path}: the training that made it diverged at step {stopped['step']}; it holds the "
                          f"weights of step {stopped['step'] - 1}: expect poor results (train again with a lower "
                          "--lr)", stacklevel=2)
        return model.eval()
