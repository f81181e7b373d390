"""Real people's recordings (prompts.py): persons, splits by person, decoding, trimming."""
import numpy as np
import pytest

from normlab.diarization.data import prompts as P


def test_splits_are_disjoint_by_person_and_cover_every_person():
    seen = [k for keys in P.SPLIT_PERSONS.values() for k in keys]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(p.key for p in P.PERSONS)


def test_every_person_has_a_licence_and_a_package():
    for p in P.PERSONS:
        assert p.packages and p.licence and p.sex in ("f", "m")


def test_unknown_person_and_split_are_clear_errors():
    with pytest.raises(ValueError, match="unknown person"):
        P.person("nobody")
    with pytest.raises(ValueError, match="split must be"):
        P.installed("validation")


def test_trim_removes_silence_at_both_ends_only():
    sr = 8000
    speech = np.sin(np.arange(sr) * 0.3).astype(np.float32)
    x = np.concatenate([np.zeros(sr // 2, np.float32), speech, np.zeros(sr // 4, np.float32), speech,
                        np.zeros(sr, np.float32)])
    y = P.trim(x, sr)
    assert abs(len(y) - (2 * sr + sr // 4)) <= sr // 50  # the inner pause stays; the ends go (20 ms frames)


@pytest.mark.parametrize("key", [p.key for p in P.PERSONS])
def test_each_installed_person_decodes_to_speech(key):
    files = P.files(P.person(key))
    if not files:
        pytest.skip(f"{key}'s package ({', '.join(P.person(key).packages)}) is not installed")
    x = P.read(files[0])
    assert x.dtype == np.float32 and x.ndim == 1 and len(x) > 800 and np.abs(x).max() > 1e-3


def test_a_header_without_samples_is_no_prompt_and_the_others_decode(tmp_path, monkeypatch):
    import soundfile as sf

    sr = 8000
    speech = (0.3 * np.sin(np.arange(sr) * 0.3)).astype(np.float32)
    sf.write(tmp_path / "a.wav", speech, sr)
    sf.write(tmp_path / "b.wav", np.zeros(0, np.float32), sr)  # 44 bytes: a header alone
    sf.write(tmp_path / "c.wav", speech[: sr // 2], sr)
    assert (tmp_path / "b.wav").stat().st_size > 0  # files() keeps it: only decoding finds it empty
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "PERSONS", (P.Person("tmp", ("none",), (str(tmp_path / "*.wav"),), "xx", "f", "none"),))
    P.prompts.cache_clear()
    try:
        got = P.prompts("tmp")
    finally:
        P.prompts.cache_clear()
    assert [len(x) for x in got] == [sr, sr // 2]
    assert list((tmp_path / "cache" / "prompts").glob("tmp-*.npz"))  # cached where NORMLAB_CACHE_DIR says


def test_a_recording_reachable_by_two_paths_is_listed_once(tmp_path):
    """asterisk links digits/fr to ../fr/digits: Armelle's 327 prompts were listed as 485 (digits and letters
    drawn twice as often)."""
    (tmp_path / "fr" / "digits").mkdir(parents=True)
    for name in ("1.wav", "2.wav"):
        (tmp_path / "fr" / "digits" / name).write_bytes(b"RIFF....")
    (tmp_path / "fr" / "hello.wav").write_bytes(b"RIFF....")
    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "fr").symlink_to(tmp_path / "fr" / "digits")
    person = P.Person("x", ("pkg",), (str(tmp_path / "fr" / "**" / "*.wav"), str(tmp_path / "digits" / "fr" / "*.wav")),
                      "fr", "f", "CC0")
    found = P.files(person)
    assert len(found) == 3 and len({f.resolve() for f in found}) == 3


def test_a_silent_prompt_is_read_without_the_diarizing_advice(tmp_path):
    """The packages' silence/ prompts (-84 dBFS) printed the recording reader's "too quiet to diarize ... scale
    it up" the first time the persons' prompts were read: 30 lines about files the recipe drops anyway."""
    import warnings

    import soundfile as sf

    sf.write(tmp_path / "1.wav", np.full(800, 6e-5, dtype=np.float32), 8000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert P.read(tmp_path / "1.wav").size == 800
