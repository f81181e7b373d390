"""Modules holding per-device constants (sinusoidal tables, the GE2E window, the powerset table) pickle."""
import copy
import io

import torch

from normlab.diarization.models.eend import EENDModel, ModelConfig
from normlab.diarization.models.embed import SpeakerEncoder
from normlab.models import ConformerEncoder, TransformerEncoder, VideoEncoder
from normlab.nn.constants import DeviceConstant


def _saved(module):
    buf = io.BytesIO()
    torch.save(module, buf)  # a lambda in a DeviceConstant made this raise: "Can't pickle local object"
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_encoders_with_sinusoidal_positions_save_and_load_whole():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    for m in (TransformerEncoder(8, 2, 1), ConformerEncoder(8, 2, 1)):
        m.eval()
        y = m(x)  # the table is made and kept: it must not travel with the module
        assert torch.equal(_saved(m)(x), y)
        assert torch.equal(copy.deepcopy(m)(x), y)
    v = VideoEncoder(8, 2, 1, n_patches=3).eval()
    xv = torch.randn(2, 4, 3, 8)
    assert torch.equal(_saved(v)(xv), v(xv))


def test_diarization_models_save_and_load_whole():
    wave = torch.randn(16000)
    enc = SpeakerEncoder()
    assert torch.equal(_saved(enc).features(wave), enc.features(wave))
    model = EENDModel(ModelConfig(head="powerset", n_speakers=3, max_active=2)).eval()
    feats = torch.randn(1, 20, model.cfg.input_dim)
    assert torch.equal(_saved(model).activity(feats), model.activity(feats))


def test_the_tensors_made_are_not_pickled():
    c = DeviceConstant(torch.arange(4.0))
    c(torch.device("cpu"), torch.float64)
    assert c._made and not copy.deepcopy(c)._made
    assert torch.equal(copy.deepcopy(c)(torch.device("cpu")), torch.arange(4.0))


def test_a_constant_first_made_under_inference_mode_serves_autograd_later():
    """A model evaluated under ``inference_mode`` first kept an inference tensor: compiled, it then failed in its
    first forward where autograd records ("Inference tensors cannot be saved for backward")."""
    import functools

    table = DeviceConstant(functools.partial(torch.linspace, 0.5, 1.5, 4))
    with torch.inference_mode():
        assert torch.equal(table(torch.device("cpu")), torch.linspace(0.5, 1.5, 4))
    x = torch.ones(4, requires_grad=True)
    (x * table(torch.device("cpu"))).sum().backward()  # the product saves the constant for x's gradient
    assert torch.equal(x.grad, torch.linspace(0.5, 1.5, 4))
