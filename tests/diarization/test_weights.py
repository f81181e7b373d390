"""The weight files shipped in the package: normlab's safetensors reader and writer agree with the ``safetensors``
package both ways, the shipped files are exactly what the conversion makes from the source packages (when those
are installed), and a damaged file is named."""
import importlib.util
import pathlib
import tempfile

import pytest
import torch

from normlab.diarization.models import weights
from normlab.diarization.models.embed import SpeakerEncoder
from normlab.diarization.models.vad import SileroVAD
from normlab.diarization.models.weights import ASSETS, read_safetensors, write_safetensors

SHIPPED = ("ge2e.safetensors", "silero_vad.safetensors")


def _mixed():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3, 5, generator=g), "h": torch.randn(7, generator=g).half(),
            "b": torch.randn(2, 2, generator=g).bfloat16(), "d": torch.randn(1, generator=g).double(),
            "i": torch.arange(6, dtype=torch.int64).reshape(2, 3), "m": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4)}


@pytest.mark.parametrize("name", SHIPPED)
def test_the_reader_agrees_with_the_safetensors_package_on_the_shipped_files(name):
    st = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    ours, meta = read_safetensors(ASSETS / name)
    theirs = st.load_file(ASSETS / name)
    assert sorted(ours) == sorted(theirs) and len(ours) > 5
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
    with safe_open(ASSETS / name, "pt") as f:
        assert f.metadata() == meta
    assert meta["source_sha256"] and meta["license"] in ("Apache-2.0", "MIT")


def test_files_written_here_read_there_and_back():
    st = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    tensors = _mixed()
    with tempfile.TemporaryDirectory() as d:
        ours, theirs = pathlib.Path(d) / "ours.safetensors", pathlib.Path(d) / "theirs.safetensors"
        write_safetensors(ours, tensors, {"source": "test", "n": 3})
        st.save_file(tensors, theirs, metadata={"source": "test", "n": "3"})
        loaded = st.load_file(ours)
        with safe_open(ours, "pt") as f:
            assert f.metadata() == {"source": "test", "n": "3"}
        back, meta = read_safetensors(theirs)
        assert meta == {"source": "test", "n": "3"}
        for k, t in tensors.items():
            for got in (loaded[k], back[k]):
                assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k


def test_the_models_load_the_shipped_weights_and_save_them_unchanged(tmp_path):
    enc, vad = SpeakerEncoder.load(), SileroVAD.load()
    assert sum(p.numel() for p in enc.parameters()) == 1_423_616
    for model, cls, name in ((enc, SpeakerEncoder, "e.safetensors"), (vad, SileroVAD, "v.safetensors")):
        model.save(tmp_path / name)
        again = cls.load(tmp_path / name)
        for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
            assert k == k2 and torch.equal(a, b)


@pytest.mark.skipif(importlib.util.find_spec("resemblyzer") is None or importlib.util.find_spec("silero_vad") is None,
                    reason="the source packages are not installed (pip install --no-deps resemblyzer==0.1.4 "
                    "silero-vad==6.2.3)")
def test_the_shipped_files_are_what_the_conversion_makes(tmp_path):
    from normlab.diarization.models.convert_weights import convert

    for path in convert(tmp_path):
        assert path.read_bytes() == (ASSETS / path.name).read_bytes(), path.name


def test_a_damaged_file_is_named(tmp_path):
    good = (ASSETS / "ge2e.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="cut.safetensors is not a GE2E speaker encoder"):
        SpeakerEncoder.load(tmp_path / "cut.safetensors")
    with pytest.raises(ValueError, match="cut.safetensors is not a safetensors file"):
        read_safetensors(tmp_path / "cut.safetensors")


def test_a_missing_asset_names_the_file_and_a_command_that_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(weights, "ASSETS", tmp_path)
    with pytest.raises(weights.MissingAssetError) as e:
        SileroVAD.load()
    message = str(e.value)
    assert "silero_vad.safetensors" in message and "pip install --force-reinstall --no-deps normlab" in message
    assert "\n" not in message
