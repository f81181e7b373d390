"""Speaker diarization ("who spoke when") on normlab encoders.

Laid out by role (as pyannote.audio):

* ``io``: audio files and waveforms (``audio``), EEND features (``features``), RTTM and UEM files;
* ``data``: base voices, perturbations, simulated conversations and the training set made of them;
* ``models``: the EEND segmentation model (``eend``) and its powerset head (``powerset``), the CAM++ and
  GE2E speaker encoders (``campplus``, ``embed``), the Silero VAD (``vad``) and the lookup of weight files
  in installed packages (``weights``);
* ``training``: the PIT loss (``pit``, ``permutation``), the training loop (``train``) and the
  one-command recipe that trains the model shipped in the package (``recipe``, ``provenance``);
* ``pipeline``: audio to turns for any number of speakers (``api.diarize``): EEND on short windows
  (``segment``), embeddings and clustering (``cluster``), stitching (``stitch``), post-processing and
  the settings (``config``);
* ``metrics``: the Diarization Error Rate (``der``), scoring and tuning on a folder (``evaluate``)
  and per-window scoring of a segmentation model (``windows``).

The formats, the features and the DER conventions are in docs/diarization.md.
"""
from .io.rttm import Turn, read_rttm, write_rttm
from .io.uem import read_uem, write_uem
from .metrics.der import DERResult, diarization_error_rate
from .models.eend import SHIPPED, EENDModel, ModelConfig
from .pipeline.api import diarize, diarize_files, from_annotation, to_annotation
from .pipeline.output import Diarization, exclusive_turns
from .pipeline.postprocess import to_turns
from .training.pit import pit_bce
from .training.train import TrainConfig, train

__all__ = ["diarize", "diarize_files", "Diarization", "exclusive_turns", "to_annotation", "from_annotation",
           "Turn", "read_rttm", "write_rttm",
           "read_uem", "write_uem", "DERResult", "diarization_error_rate",
           "pit_bce", "EENDModel", "ModelConfig", "SHIPPED", "to_turns", "TrainConfig", "train"]
