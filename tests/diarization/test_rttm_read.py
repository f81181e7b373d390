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


def test_a_label_read_is_a_label_written_and_a_line_of_two_records_is_an_error(tmp_path):
    """Reading kept "Jean\xa0A" whole but writing refused it; a form feed between two records (once a line end)
    made the second record extra fields of the first, dropped without a word."""
    from normlab.diarization import Turn, write_rttm

    p = tmp_path / "x.rttm"
    write_rttm([Turn("r", 0.0, 1.0, "Jean\xa0A")], p)
    assert [t.speaker for t in read_rttm(p)["r"]] == ["Jean\xa0A"]
    for bad in ("a b", "a\tb", "a\nb"):
        with pytest.raises(BadValue, match="without spaces"):
            write_rttm([Turn("r", 0.0, 1.0, bad)], p)
    p.write_text("SPEAKER r 1 0 1 <NA> <NA> A <NA> <NA>\fSPEAKER r 1 1 1 <NA> <NA> B <NA> <NA>\n")
    with pytest.raises(BadValue, match=r"x.rttm:1: .*expected 10 fields .*got 20"):
        read_rttm(p)


def test_fields_are_split_at_spaces_and_tabs_only_and_lines_at_line_ends_only(tmp_path):
    """A no-break space or U+2028 inside a label is part of it (pyannote reads it so); a byte-order mark is not
    a field; CR, LF and CRLF end lines. `str.split` split "Jean\\xa0A" into "Jean", merging two speakers."""
    p = tmp_path / "x.rttm"
    p.write_text("\ufeffSPEAKER r 1 0.000 2.000 <NA> <NA> Jean\xa0A <NA> <NA>\r"
                 "SPEAKER r 1 2.000 2.000 <NA> <NA> Jean\xa0B <NA> <NA>\r\n"
                 "SPEAKER\tr\t1\t4.000\t1.000\t<NA>\t<NA>\tC\u2028D\t<NA>\t<NA>\n", encoding="utf-8")
    assert [t.speaker for t in read_rttm(p)["r"]] == ["Jean\xa0A", "Jean\xa0B", "C\u2028D"]


@pytest.mark.parametrize("number", ["1_0", "\u0661\u0662", "\uff11", "nan", "inf", "0x10"])
def test_a_time_must_be_a_plain_decimal_number(tmp_path, number):
    """float() takes "1_0" (10.0), Arabic-Indic and full-width digits: in a file they are corruption."""
    from normlab.diarization.io.uem import read_uem

    p = tmp_path / "x.rttm"
    p.write_text(f"SPEAKER a 1 {number} 1.000 <NA> <NA> A <NA> <NA>\n", encoding="utf-8")
    with pytest.raises(BadValue, match=r"x.rttm:1: .*onset"):
        read_rttm(p)
    u = tmp_path / "x.uem"
    u.write_text(f"a 1 0 {number}\n", encoding="utf-8")
    with pytest.raises(BadValue, match=r"x.uem:1: .*offset"):
        read_uem(u)


def test_plain_decimals_of_every_form_are_read(tmp_path):
    p = tmp_path / "x.rttm"
    p.write_text("SPEAKER a 1 +1 .5 <NA> <NA> A\nSPEAKER a 1 2. 1e-1 <NA> <NA> B\nSPEAKER a 1 3.25E0 0 <NA> <NA> C\n")
    assert [(t.start, t.duration) for t in read_rttm(p)["a"]] == [(1.0, 0.5), (2.0, 0.1), (3.25, 0.0)]
