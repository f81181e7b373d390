"""The per-recording feature cache ``wav/<uri>.feats.pt`` of MixtureSet: used only while it belongs to its WAV."""
import os
import pathlib
import shutil
import warnings

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.diarization.data.dataset import MixtureSet
from normlab.diarization.io.features import RULES, FeatureConfig


def _mixtures(folder: pathlib.Path, n: int = 2, seconds: float = 3.0) -> pathlib.Path:
    """``folder/wav/m<i>.wav`` (8 kHz noise, each its own) with two speakers' turns in ``.rttm``."""
    (folder / "wav").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        sf.write(folder / "wav" / f"m{i}.wav", rng.standard_normal(int(8000 * seconds * (1 + i / 4))).astype(
            "float32") * 0.1, 8000)
        (folder / "wav" / f"m{i}.rttm").write_text(f"SPEAKER m{i} 1 0.50 1.00 <NA> <NA> a <NA> <NA>\n"
                                                  f"SPEAKER m{i} 1 1.50 1.00 <NA> <NA> b <NA> <NA>\n")
    return folder


@pytest.fixture
def data(tmp_path):
    folder = _mixtures(tmp_path / "sim")
    fresh = [f for f, _ in MixtureSet(folder).items]  # writes the caches
    assert sorted(p.name for p in (folder / "wav").glob("*.feats.pt")) == ["m0.feats.pt", "m1.feats.pt"]
    return folder, fresh


def _quietly(folder, **kw) -> MixtureSet:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid cache is read without a word
        return MixtureSet(folder, **kw)


def test_a_valid_cache_is_read_not_rebuilt(data, monkeypatch):
    folder, fresh = data
    import normlab.diarization.data.dataset as dataset

    monkeypatch.setattr(dataset, "extract", lambda *a, **k: pytest.fail("features extracted again"))
    again = _quietly(folder)
    assert all(torch.equal(a, f) for (a, _), f in zip(again.items, fresh))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "wrong shape", "wrong form", "empty"])
def test_a_cache_that_cannot_be_read_is_rebuilt_with_one_warning(data, damage):
    """A truncated cache raised PytorchStreamReader's RuntimeError, garbage a KeyError, a wrong shape an
    IndexError at the first batch: now every broken cache is rebuilt from its WAV, with one warning in all."""
    folder, fresh = data
    for cache in sorted((folder / "wav").glob("*.feats.pt")):
        good = cache.read_bytes()
        if damage == "truncated":
            cache.write_bytes(good[:2000])
        elif damage == "garbage":
            cache.write_bytes(b"hello world" * 50)
        elif damage == "wrong shape":
            blob = torch.load(cache, weights_only=True)
            torch.save({**blob, "feats": torch.zeros(5)}, cache)
        elif damage == "wrong form":
            torch.save({"a": 1}, cache)
        else:
            cache.write_bytes(b"")
    with pytest.warns(UserWarning, match="2 feature caches could not be read") as caught:
        rebuilt = MixtureSet(folder)
    assert len([w for w in caught if "feature cache" in str(w.message)]) == 1
    assert all(torch.equal(a, f) for (a, _), f in zip(rebuilt.items, fresh))
    _quietly(folder)  # the rebuilt caches are good
    assert not list((folder / "wav").glob("*.tmp"))  # written atomically: no temporary file left


def test_an_older_cache_of_features_alone_is_rebuilt_quietly(data):
    folder, fresh = data
    cache = folder / "wav" / "m0.feats.pt"
    torch.save(torch.zeros(5), cache)  # not tied to any WAV: cannot be trusted
    assert torch.equal(_quietly(folder).items[0][0], fresh[0])


def test_a_replaced_wav_is_read_again(data):
    """The cache was not tied to its WAV: after the WAV was replaced, training silently used the old features."""
    folder, fresh = data
    wav = folder / "wav"
    shutil.copy(wav / "m1.wav", wav / "m0.wav")  # new content (and size)
    (wav / "m0.rttm").write_text((wav / "m1.rttm").read_text().replace("SPEAKER m1 ", "SPEAKER m0 "))
    now = _quietly(folder)
    assert torch.equal(now.items[0][0], fresh[1])


def test_a_wav_rewritten_with_the_same_size_is_read_again(data):
    folder, fresh = data
    wav = folder / "wav" / "m0.wav"
    st = wav.stat()
    x, sr = sf.read(wav, dtype="float32")
    sf.write(wav, x[::-1].copy(), sr)  # other content, same size
    os.utime(wav, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a coarse clock could have kept the time: step it
    assert wav.stat().st_size == st.st_size
    assert not torch.equal(_quietly(folder).items[0][0], fresh[0])


def test_a_copied_folder_keeps_using_its_caches(data, tmp_path, monkeypatch):
    """``cp -r`` gives every WAV a new modification time, not new content: the caches still hold."""
    folder, fresh = data
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, copy_function=shutil.copyfile)  # contents only, new times
    import normlab.diarization.data.dataset as dataset

    monkeypatch.setattr(dataset, "extract", lambda *a, **k: pytest.fail("features extracted again"))
    assert all(torch.equal(a, f) for (a, _), f in zip(_quietly(copy).items, fresh))


def test_another_feature_setup_does_not_use_the_cache(data):
    folder, fresh = data
    other = FeatureConfig(n_mels=10, context=2)
    items = _quietly(folder, cfg=other).items
    assert items[0][0].shape[1] == other.dim == 50
    assert torch.equal(_quietly(folder).items[0][0], fresh[0])  # and back


def test_a_cache_of_another_extractor_version_is_made_again(data):
    """The extractor's rules changed (long stretches without talk left out of the recording mean) while the
    feature setup stayed: a resumed recipe read the old features of its long-paused mixtures beside new ones."""
    folder, fresh = data
    cache = folder / "wav" / "m0.feats.pt"
    blob = torch.load(cache, weights_only=True)
    assert blob["rules"] == RULES
    torch.save({**{k: v for k, v in blob.items() if k != "rules"}, "feats": blob["feats"] + 1}, cache)  # version 1
    assert torch.equal(_quietly(folder).items[0][0], fresh[0])
    assert torch.load(cache, weights_only=True)["rules"] == RULES


def test_a_read_only_folder_is_read_without_caching(data, monkeypatch):
    folder, fresh = data
    cache = folder / "wav" / "m0.feats.pt"
    torch.save(torch.zeros(5), cache)  # to be rebuilt ...
    import normlab.diarization.data.dataset as dataset

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied", str(cache))

    monkeypatch.setattr(dataset.torch, "save", refused)  # ... where it cannot be written
    assert torch.equal(_quietly(folder).items[0][0], fresh[0])
    assert torch.equal(torch.load(cache, weights_only=True), torch.zeros(5))


def test_labels_that_name_another_recording_are_refused(tmp_path):
    """wav/x.rttm naming another recording (files renamed) labelled the whole mixture silence, without a word."""
    from normlab._checks import UserError

    folder = _mixtures(tmp_path / "sim")
    rttm = folder / "wav" / "m1.rttm"
    rttm.write_text(rttm.read_text().replace("SPEAKER m1 ", "SPEAKER other "))
    with pytest.raises(UserError, match=r"m1.rttm names the recording 'other', not 'm1'"):
        MixtureSet(folder)
    rttm.write_text("")  # no turns at all: a mixture of silence, as simulated
    assert float(MixtureSet(folder).items[1][1].sum()) == 0


def test_the_data_digest_follows_what_training_reads(tmp_path):
    """A resume compares the data's digest, which hashed ref.rttm alone where it exists: the labels training reads
    (wav/*.rttm) or the audio changed under a checkpoint without a word, and a comment added to ref.rttm (never
    read by training) stopped the resume."""
    from normlab.diarization.training.train import data_digest

    folder = _mixtures(tmp_path / "sim", n=3)
    (folder / "config.json").write_text("{}")
    (folder / "ref.rttm").write_text((folder / "wav" / "m0.rttm").read_text())
    digest = data_digest([folder])
    with open(folder / "ref.rttm", "a") as f:
        f.write(";; a comment\n")
    assert data_digest([folder]) == digest
    rttm = folder / "wav" / "m0.rttm"
    rttm.write_text(rttm.read_text().replace("1.50 1.00", "1.50 0.50"))
    relabelled = data_digest([folder])
    assert relabelled != digest
    shutil.copy(folder / "wav" / "m2.wav", folder / "wav" / "m0.wav")  # other audio under the same name
    assert data_digest([folder]) != relabelled
