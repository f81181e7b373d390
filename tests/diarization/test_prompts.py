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
