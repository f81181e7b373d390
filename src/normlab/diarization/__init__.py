"""Speaker diarization ("who spoke when") on normlab encoders.

The whole pipeline of lesson 000: simulated conversations (``simulate``),
EEND features (``features``), an EEND model on a Pre-Norm encoder
(``model``), its training loop (``train``), inference from audio to RTTM
for any number of speakers (``api.diarize``: EEND on short windows, GE2E
speaker embeddings, clustering; ``pipeline``, ``embed``, ``cluster``,
``permutation``), the Diarization Error Rate (``der``), the
post-processing tuned on a dev split (``evaluate``) and the one-command
recipe that trains the model shipped in the package (``recipe``).
"""
from .api import diarize, diarize_files, from_annotation, to_annotation
from .der import DERResult, diarization_error_rate
from .model import SHIPPED, EENDModel, ModelConfig
from .pit import pit_bce
from .postprocess import to_turns
from .rttm import Turn, read_rttm, read_uem, write_rttm, write_uem
from .train import TrainConfig, train

__all__ = ["diarize", "diarize_files", "to_annotation", "from_annotation", "Turn", "read_rttm", "write_rttm",
           "read_uem", "write_uem", "DERResult", "diarization_error_rate",
           "pit_bce", "EENDModel", "ModelConfig", "SHIPPED", "to_turns", "TrainConfig", "train"]
