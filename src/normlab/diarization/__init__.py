"""Speaker diarization ("who spoke when") on normlab encoders.

This package so far has the formats (RTTM, UEM), the Diarization Error Rate
with collars, UEM and overlap options, the permutation-invariant loss, the
EEND features, the EEND model, its training loop (checkpoints, resume) and
the post-processing from frame probabilities to speaker turns.
"""
from .der import DERResult, diarization_error_rate
from .model import EENDModel, ModelConfig
from .pit import pit_bce
from .postprocess import to_turns
from .rttm import Turn, read_rttm, read_uem, write_rttm, write_uem
from .train import TrainConfig, train

__all__ = ["Turn", "read_rttm", "write_rttm", "read_uem", "write_uem", "DERResult", "diarization_error_rate",
           "pit_bce", "EENDModel", "ModelConfig", "to_turns", "TrainConfig", "train"]
