"""Reading RTTM: turns sorted by start, a short line a one-line error naming the file and line."""
import pytest

from normlab._checks import BadValue
from normlab.diarization import read_rttm


def test_read_rttm_sorts_by_start(tmp_path):
    p = tmp_path / "x.rttm"
    p.write_text("SPEAKER a 1 5.000 1.000 <NA> <NA> B <NA> <NA>\nSPEAKER a 1 0.000 1.000 <NA> <NA> A <NA> <NA>\n")
    assert [t.start for t in read_rttm(p)["a"]] == [0.0, 5.0]

def test_a_short_speaker_line_is_a_bad_value_naming_the_line(tmp_path):
    p = tmp_path / "x.rttm"
    p.write_text("SPEAKER a 1 0.000 1.000 <NA> <NA>\n")
    with pytest.raises(BadValue, match=r"x.rttm:1: "):
        read_rttm(p)
