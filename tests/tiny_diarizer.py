"""Shared pieces of the diarization tests (importable from every test folder): a tiny random segmentation
model with its speaker encoder, and two tone 'speakers' taking turns (the pipeline's bookkeeping is under test
there, not its accuracy)."""
import numpy as np
import torch

from normlab.diarization.models.eend import EENDModel, ModelConfig
from normlab.diarization.models.embed import SpeakerEncoder

SR = 16000


def tiny_models(folder, bias: float, head: str = "multilabel", **postprocess):
    """``folder/m.pt`` (a 1-layer EEND model, 3 local speakers, head bias ``bias``: how often it says "speech";
    for a powerset head, the bias of the classes with speakers, silence at 0) and ``folder/enc.pt`` (a random
    speaker encoder); ``postprocess`` goes into the model file. The tones below hold a steady level, which the
    pipeline's steady-noise gate (``flat_db``) would silence: it is off in these files unless asked for."""
    torch.manual_seed(0)
    model = EENDModel(ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, n_speakers=3, dropout=0.0, head=head))
    with torch.no_grad():
        model.head.bias.fill_(bias)
        if head == "powerset":
            model.head.bias[0] = 0.0  # class 0: nobody talks
    model.postprocess.update({"flat_db": 0.0, **postprocess})
    model.save(folder / "m.pt")
    SpeakerEncoder().save(folder / "enc.pt")
    return folder / "m.pt", folder / "enc.pt"


def tones(seconds: float, seed: int = 0) -> np.ndarray:
    """Two tone 'speakers' (180 and 900 Hz, 20% dropouts) taking 2 s turns, with a little noise; float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    voices = [0.3 * np.sin(2 * np.pi * f * t) * (rng.random(len(t)) > 0.2) for f in (180.0, 900.0)]
    return (np.where((t % 4) < 2, voices[0], voices[1]) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)
