"""The weight files shipped in the package: normlab's safetensors reader and writer agree with the ``safetensors``
package both ways, the shipped files are exactly what the conversion makes from the source packages (when those
are installed), and a damaged file is named."""
import importlib.util
import json
import pathlib
import struct
import tempfile

import pytest
import torch

from normlab._checks import BadValue
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
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
            # the format's other dtypes: a valid file with them was "not a safetensors file: 'U16'"
            "u16": torch.tensor([0, 7, 65535], dtype=torch.uint16),
            "u32": torch.tensor([1, 2**32 - 1], dtype=torch.uint32),
            "u64": torch.tensor([3, 2**63], dtype=torch.uint64),
            "e4m3": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
            "e5m2": torch.randn(5, generator=g).to(torch.float8_e5m2)}


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
                assert got.dtype == t.dtype and got.shape == t.shape, k
                bytes_of = lambda x: x.reshape(-1).view(torch.uint8)  # noqa: E731 - (float8 has no equal)
                assert torch.equal(bytes_of(got), bytes_of(t)), k


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


def _file(path: pathlib.Path, header, body: bytes = b"", length: int | None = None) -> pathlib.Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + body)
    return path


def _t(dtype="F32", shape=(1,), offsets=(0, 4)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


HOSTILE = {  # each once raised Python's own error (a crash in load_bert), or read what no tensor owns
    "negative shape": {"a": _t(shape=(-1, -4), offsets=(0, 16))},
    "numel overflow": {"a": _t(shape=(2**62, 2**62, 0), offsets=(0, 0))},
    "shape a string": {"a": _t(shape="4", offsets=(0, 16))},
    "shape a float": {"a": _t(shape=(4.0,), offsets=(0, 16))},
    "offsets a bool": {"a": _t(offsets=(False, 4))},
    "offsets before the body": {"a": _t(offsets=(-4, 0))},
    "overlap": {"a": _t(), "b": _t()},
    "a gap": {"a": _t(offsets=(4, 8))},
    "bytes after the last": {"a": _t(shape=(0,), offsets=(0, 0))},
    "header a number": 5,
    "metadata a list": {"__metadata__": [1, 2]},
    "metadata not strings": {"__metadata__": {"n": 3}},
    "no dtype": {"a": {"shape": [1], "data_offsets": [0, 4]}},
    "nested": b"[" * 100_000,
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_file_the_format_rules_out_is_one_line(tmp_path, case):
    from normlab.diarization.models.weights import safetensors_metadata

    path = _file(tmp_path / "x.safetensors", HOSTILE[case], b"\0" * 16 if case != "bytes after the last" else b"\0" * 4)
    for read in (read_safetensors, safetensors_metadata):
        with pytest.raises(BadValue, match="x.safetensors is not a safetensors file: "):
            read(path)


@pytest.mark.parametrize("length", [3 << 30, 2**64 - 1, None])
def test_the_header_length_is_checked_before_it_is_read(tmp_path, length):
    """A 10-byte file claiming a 3 GB header: the metadata reader allocated the 3 GB first (MemoryError under a
    memory limit), then a JSON error; 2**64 - 1 an OverflowError; a file shorter than 8 bytes struct.error."""
    from normlab.diarization.models.weights import safetensors_metadata

    path = tmp_path / "x.safetensors"
    if length is None:
        path.write_bytes(b"\1\0")
    else:
        _file(path, b"{}", length=length)
    for read in (read_safetensors, safetensors_metadata):
        with pytest.raises(BadValue, match="x.safetensors is not a safetensors file: "):
            read(path)


def test_what_the_format_cannot_hold_is_refused_before_writing(tmp_path):
    """A tensor named "__metadata__" was written, then read back as the metadata (the user's metadata and the
    tensor both lost); a dtype without a safetensors name raised KeyError."""
    from normlab._checks import BadType

    with pytest.raises(BadValue, match="'__metadata__' is the safetensors header's metadata, not a tensor name"):
        write_safetensors(tmp_path / "a.safetensors", {"__metadata__": torch.ones(2), "w": torch.zeros(1)}, {"k": "v"})
    with pytest.raises(BadType, match="safetensors has no dtype for torch.complex64"):
        write_safetensors(tmp_path / "a.safetensors", {"c": torch.ones(2, dtype=torch.complex64)})
    assert not list(tmp_path.iterdir())
