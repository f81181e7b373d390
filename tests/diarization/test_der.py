"""DER against hand-computed cases and pyannote.metrics; RTTM/UEM round trips; PIT loss."""
from __future__ import annotations

import importlib.util
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from normlab._checks import BadValue
from normlab.diarization import Turn, diarization_error_rate, pit_bce, read_rttm, read_uem, write_rttm, write_uem
from normlab.diarization.metrics.der import score


def T(s, e, spk, uri="a"):
    return Turn(uri, s, e - s, spk)


def test_perfect_and_relabelled_hypothesis_is_zero():
    ref = [T(0, 5, "A"), T(5, 9, "B"), T(7, 8, "A")]
    hyp = [T(0, 5, "x"), T(5, 9, "y"), T(7, 8, "x")]
    r = diarization_error_rate(ref, hyp)
    assert r.der == 0 and r.total == pytest.approx(10.0)  # overlap 7-8 counted for both speakers


def test_hand_computed_components():
    ref = [T(0, 10, "A"), T(10, 20, "B")]
    hyp = [T(0, 8, "s1"), T(8, 20, "s2"), T(20, 22, "s2")]
    r = diarization_error_rate(ref, hyp)
    # mapping A->s1, B->s2: 8-10 is confusion (2 s), 20-22 false alarm (2 s), no miss; total 20 s
    assert (r.confusion, r.false_alarm, r.missed, r.total) == pytest.approx((2, 2, 0, 20))
    assert r.der == pytest.approx(0.2)


def test_overlap_miss_and_collar():
    ref = [T(0, 10, "A"), T(5, 10, "B")]
    hyp = [T(0, 10, "h")]
    r = diarization_error_rate(ref, hyp)
    assert (r.missed, r.total) == pytest.approx((5, 15))  # B's 5 s missed inside the overlap
    c = diarization_error_rate(ref, hyp, collar=1.0)  # removes [-1,1], [4,6], [9,11]
    assert c.total == pytest.approx(2 * 3 + 1 * 3 + 0)  # 6-9 twice (A, B) + 1-4 once (A)
    s = diarization_error_rate(ref, hyp, skip_overlap=True)
    assert (s.missed, s.total) == pytest.approx((0, 5))


def test_uem_restricts_scoring():
    ref = [T(0, 10, "A")]
    hyp = [T(0, 4, "h")]
    r = diarization_error_rate(ref, hyp, uem=[(0, 5)])
    assert (r.missed, r.total) == pytest.approx((1, 5))


def test_missing_hypothesis_uri_is_all_miss():
    r = score({"a": [T(0, 3, "A")], "b": [T(0, 2, "B", "b")]}, {"a": [T(0, 3, "x")]})
    assert (r.missed, r.total) == pytest.approx((2, 5))


def _random_annotation(rng, uri, n_spk, dur=60.0):
    turns = []
    for k in range(n_spk):
        t = rng.uniform(0, 3)
        while t < dur:
            d = rng.uniform(0.3, 4.0)
            turns.append(Turn(uri, round(t, 3), round(d, 3), f"s{k}"))
            t += d + rng.expovariate(1 / 2.0)  # same-speaker turns never overlap; speakers do
    return turns


def _to_pyannote(turns):
    from pyannote.core import Annotation, Segment

    ann = Annotation()
    for i, t in enumerate(turns):
        ann[Segment(t.start, t.end), i] = t.speaker
    return ann


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("collar,skip", [(0.0, False), (0.25, False), (0.25, True), (0.0, True)])
def test_matches_pyannote_metrics(seed, collar, skip):
    pytest.importorskip("pyannote.metrics")
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate

    rng = random.Random(seed)
    ref = _random_annotation(rng, "a", rng.randint(1, 4))
    hyp = _random_annotation(rng, "a", rng.randint(1, 4))
    uem = [(1.0, 50.0)] if seed % 2 else None
    ours = diarization_error_rate(ref, hyp, collar=collar, skip_overlap=skip, uem=uem)
    metric = DiarizationErrorRate(collar=2 * collar, skip_overlap=skip)  # pyannote's collar is the total width
    kw = {} if uem is None else {"uem": Timeline([Segment(*uem[0])])}
    theirs = metric(_to_pyannote(ref), _to_pyannote(hyp), detailed=True, **kw)
    assert ours.total == pytest.approx(theirs["total"], abs=1e-6)
    assert ours.missed == pytest.approx(theirs["missed detection"], abs=1e-6)
    assert ours.false_alarm == pytest.approx(theirs["false alarm"], abs=1e-6)
    assert ours.confusion == pytest.approx(theirs["confusion"], abs=1e-6)


def test_a_zero_length_reference_turn_is_no_speech_and_has_no_collar():
    """pyannote.core drops empty segments; a collar cut around one removed 0.5 s of scored speech here."""
    ref, hyp = [T(0, 2, "A"), T(1, 1, "B"), T(9, 9, "C")], [T(0, 1.5, "h")]
    r = diarization_error_rate(ref, hyp, collar=0.25)
    assert (r.missed, r.false_alarm, r.confusion, r.total) == pytest.approx((0.25, 0, 0, 1.5))
    assert diarization_error_rate(ref, hyp).total == pytest.approx(2.0)
    if importlib.util.find_spec("pyannote.metrics"):
        from pyannote.metrics.diarization import DiarizationErrorRate

        theirs = DiarizationErrorRate(collar=0.5)(_to_pyannote(ref), _to_pyannote(hyp), detailed=True)
        assert (theirs["missed detection"], theirs["total"]) == pytest.approx((r.missed, r.total))


def test_rttm_and_uem_round_trip(tmp_path):
    turns = [T(0.5, 1.25, "A"), T(0.0, 2.0, "B"), T(3.0, 4.5, "A", "b")]
    write_rttm(turns, tmp_path / "x.rttm")
    back = read_rttm(tmp_path / "x.rttm")
    assert sorted(back["a"] + back["b"]) == sorted(turns)
    lines = (tmp_path / "x.rttm").read_text().splitlines()
    assert lines[0].split() == ["SPEAKER", "a", "1", "0.000", "2.000", "<NA>", "<NA>", "B", "<NA>", "<NA>"]
    uem = {"a": [(0.0, 10.5)], "b": [(1.0, 2.0), (3.0, 4.0)]}
    write_uem(uem, tmp_path / "x.uem")
    assert read_uem(tmp_path / "x.uem") == uem
    (tmp_path / "bad.rttm").write_text("SPEAKER a 1 zero 1.0 <NA> <NA> A <NA> <NA>\n")
    with pytest.raises(ValueError, match="bad.rttm:1"):
        read_rttm(tmp_path / "bad.rttm")
    # other RTTM types and comments are read past; a line of no RTTM type is an error, not an empty file
    (tmp_path / "other.rttm").write_text(";; a comment\nSPKR-INFO a 1 <NA> <NA> <NA> unknown A <NA> <NA>\n"
                                         "SPEAKER a 1 0.0 1.0 <NA> <NA> A <NA> <NA>\n")
    assert read_rttm(tmp_path / "other.rttm") == {"a": [Turn("a", 0.0, 1.0, "A")]}
    (tmp_path / "junk.rttm").write_text("garbage line here\n")
    with pytest.raises(ValueError, match="junk.rttm:1: not an RTTM line"):
        read_rttm(tmp_path / "junk.rttm")
    with pytest.raises(ValueError, match="spaces"):
        write_rttm([Turn("a b", 0, 1, "A")], tmp_path / "y.rttm")


def test_uem_uris_with_a_semicolon_read_back_and_a_leading_one_is_refused(tmp_path):
    uem = {"take;2": [(0.0, 1.5)], "a": [(2.0, 3.0)]}
    write_uem(uem, tmp_path / "x.uem")
    assert read_uem(tmp_path / "x.uem") == uem
    (tmp_path / "c.uem").write_text(";; a comment\na 1 0.0 1.0 ;; a note after the region\nb 1 2.0 3.0;; close\n")
    assert read_uem(tmp_path / "c.uem") == {"a": [(0.0, 1.0)], "b": [(2.0, 3.0)]}
    with pytest.raises(ValueError, match="begin with ';'"):
        write_uem({";x": [(0.0, 1.0)]}, tmp_path / "y.uem")
    assert not (tmp_path / "y.uem").exists()


def test_rttm_and_uem_are_written_as_utf8_whatever_the_locale(tmp_path):
    # an ASCII locale (LC_ALL=C without UTF-8 mode): the files are UTF-8 still, as read_rttm and read_uem read them
    script = ("import sys; from normlab.diarization import Turn, write_rttm, write_uem; d = sys.argv[1]; "
              "write_rttm([Turn('r\\u00e9union', 0.0, 1.0, 'Jos\\u00e9')], d + '/x.rttm'); "
              "write_uem({'r\\u00e9union': [(0.0, 1.0)]}, d + '/x.uem'); "
              "from normlab import written; written.write_text(d + '/w.rttm', 'r\\u00e9union\\n')")  # ASCII args
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run([sys.executable, "-X", "utf8=0", "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, encoding="utf-8")
    assert done.returncode == 0, done.stderr[-500:]
    assert read_rttm(tmp_path / "x.rttm") == {"réunion": [Turn("réunion", 0.0, 1.0, "José")]}
    assert (tmp_path / "x.uem").read_bytes() == "réunion 1 0.000 1.000\n".encode()
    assert (tmp_path / "w.rttm").read_bytes() == "réunion\n".encode()  # what diarize and evaluate write


def test_pit_is_invariant_to_swapping_label_columns():
    torch.manual_seed(0)
    logits = torch.randn(3, 20, 2, requires_grad=True)
    labels = (torch.rand(3, 20, 2) > 0.5).float()
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[1, 15:] = True
    a, perm_a = pit_bce(logits, labels, mask)
    b, perm_b = pit_bce(logits, labels.flip(-1), mask)
    assert torch.allclose(a, b)
    assert torch.equal(perm_a, perm_b.flip(-1))
    a.backward()
    assert logits.grad[1, 15:].abs().max() == 0  # padded frames get no gradient
    perfect = pit_bce(torch.where(labels.bool(), 20.0, -20.0)[..., [1, 0]], labels)[0]
    assert perfect < 1e-6
    with pytest.raises(ValueError, match="shape"):
        pit_bce(logits, labels[..., :1])


def test_cli_score(tmp_path, capsys):
    from normlab.cli import main

    write_rttm([T(0, 10, "A"), T(10, 20, "B")], tmp_path / "ref.rttm")
    write_rttm([T(0, 8, "s1"), T(8, 20, "s2"), T(20, 22, "s2")], tmp_path / "hyp.rttm")
    assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "hyp.rttm"), "--collar", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "DER: 20.00%" and "confusion:   2.000 s" in out[3]
    assert main(["diarize", "score", str(tmp_path / "nope.rttm"), str(tmp_path / "hyp.rttm")]) == 2
    assert "nope.rttm" in capsys.readouterr().err
    # a name with a line break: the line before it was all that was said ("error: no"), and a usage error split
    assert main(["diarize", "score", str(tmp_path / "no\nsuch.rttm"), str(tmp_path / "hyp.rttm")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no\\nsuch.rttm: no such file" in err, err
    assert main(["diarize", "score", "a", "b", "--collar", "1\n2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "got '1\\n2'" in err, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_cli_score_reads_a_reference_from_a_pipe(tmp_path, capsys):
    """``score <(cat ref.rttm) hyp.rttm`` and ``/dev/stdin`` said "no such file": only regular files were read."""
    import threading

    from normlab.cli import main

    write_rttm([T(0, 8, "s1"), T(8, 20, "s2"), T(20, 22, "s2")], tmp_path / "hyp.rttm")
    pipe = tmp_path / "ref.pipe"
    os.mkfifo(pipe)
    text = "SPEAKER a 1 0.000 10.000 <NA> <NA> A <NA> <NA>\nSPEAKER a 1 10.000 10.000 <NA> <NA> B <NA> <NA>\n"
    writer = threading.Thread(target=pipe.write_text, args=(text,))
    writer.start()
    try:
        assert main(["diarize", "score", str(pipe), str(tmp_path / "hyp.rttm"), "--collar", "0"]) == 0
    finally:
        if writer.is_alive():  # the command failed before it opened the pipe: let the writer go
            open(pipe).close()
        writer.join()
    assert capsys.readouterr().out.splitlines()[0] == "DER: 20.00%"


def test_cli_score_reads_folders_of_rttm(tmp_path, capsys):
    from normlab.cli import main

    ref = [Turn("a", 0, 10, "A"), Turn("b", 0, 10, "B")]
    write_rttm(ref, tmp_path / "ref.rttm")
    (tmp_path / "hyp").mkdir()
    write_rttm([Turn("a", 0, 10, "x")], tmp_path / "hyp" / "a.rttm")  # one file per recording, as diarize writes
    write_rttm([Turn("b", 0, 5, "y")], tmp_path / "hyp" / "b.rttm")
    assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "hyp"), "--collar", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "DER: 25.00%"
    (tmp_path / "empty").mkdir()
    assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "has no .rttm files" in err and len(err.strip().splitlines()) == 1


def test_cli_score_refuses_what_it_cannot_score(tmp_path, capsys):
    """One line and exit 2, never a traceback or a DER of nothing: a binary file, a non-finite or negative
    onset or duration, a collar that is not a finite number of seconds, a reference without speech; and a
    warning for hypothesis recordings the reference does not have (they are not scored)."""
    from normlab.cli import main

    ok = tmp_path / "ok.rttm"
    write_rttm([Turn("a", 0, 4, "A")], ok)
    (tmp_path / "bin.rttm").write_bytes(bytes(range(256)) * 4)
    cases = {"bin": None, "nan": "SPEAKER a 1 0 nan <NA> <NA> A <NA> <NA>\n",
             "inf": "SPEAKER a 1 inf 1 <NA> <NA> A <NA> <NA>\n", "neg": "SPEAKER a 1 -1 2 <NA> <NA> A <NA> <NA>\n",
             "zero": "SPEAKER a 1 0 0 <NA> <NA> A <NA> <NA>\n", "empty": ""}
    for name, text in cases.items():
        if text is not None:
            (tmp_path / f"{name}.rttm").write_text(text)
        for argv in (["diarize", "score", str(tmp_path / f"{name}.rttm"), str(ok)],
                     ["diarize", "score", str(ok), str(tmp_path / f"{name}.rttm")]):
            if name in ("zero", "empty") and argv[-1] != str(ok):
                continue  # as a hypothesis, no speech is a valid answer
            assert main(argv) == 2, (name, argv)
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "Traceback" not in err[0], (name, err)
            if name == "empty":  # no turns at all: said so, not "no speech outside the collars"
                assert "has no speaker turns" in err[0], err
    (tmp_path / "a.uem").write_text("a 1 0 4\n")  # with a UEM too: said so, not "no regions of its 0 recordings"
    assert main(["diarize", "score", str(tmp_path / "empty.rttm"), str(ok), "--uem", str(tmp_path / "a.uem")]) == 2
    assert "has no speaker turns" in capsys.readouterr().err
    for collar in ("nan", "inf", "-1"):
        assert main(["diarize", "score", "--collar", collar, str(ok), str(ok)]) == 2
        assert "finite number of seconds" in capsys.readouterr().err
    other = tmp_path / "other.rttm"
    write_rttm([Turn("b", 0, 4, "B")], other)
    assert main(["diarize", "score", str(ok), str(ok), str(other)]) == 0
    captured = capsys.readouterr()
    assert "DER: 0.00%" in captured.out and "1 hypothesis recordings are not in the reference" in captured.err
    # a UEM with no region of the reference's recordings (empty, or of others): said so, not "no speech"
    (tmp_path / "empty.uem").write_text("")
    (tmp_path / "other.uem").write_text("b 1 0 4\n")
    for name, says in (("empty", "has no regions at all"), ("other", "has no regions of the reference's 1")):
        assert main(["diarize", "score", str(ok), str(ok), "--uem", str(tmp_path / f"{name}.uem")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    # a UEM naming one of two reference recordings scores that one: said, and counted as one
    both = tmp_path / "both.rttm"
    write_rttm([T(0, 4, "A"), Turn("b", 0, 4, "B")], both)
    assert main(["diarize", "score", str(both), str(both), "--uem", str(tmp_path / "other.uem")]) == 0
    captured = capsys.readouterr()
    assert "recordings: 1;" in captured.out
    assert "1 reference recordings have no region in" in captured.err and ": a" in captured.err
    # a recording whose only region lasts 0 s has none: said and not counted (it was silently left out)
    (tmp_path / "zero.uem").write_text("a 1 2 2\nb 1 0 4\n")
    assert main(["diarize", "score", str(both), str(both), "--uem", str(tmp_path / "zero.uem")]) == 0
    captured = capsys.readouterr()
    assert "recordings: 1;" in captured.out and "1 reference recordings have no region in" in captured.err
    # all the reference's speech overlapped and skipped: said so, not "the reference has no speech"
    overlapped = tmp_path / "overlapped.rttm"
    write_rttm([T(0, 2, "A"), T(0, 2, "B")], overlapped)
    assert main(["diarize", "score", str(overlapped), str(ok), "--skip-overlap", "--collar", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside overlap" in err[0], err
    # one hypothesis file named twice is one file, not "turns in two files, X and X"
    assert main(["diarize", "score", str(both), str(both), str(both)]) == 0
    assert "DER: 0.00%" in capsys.readouterr().out


def test_cli_score_leaves_the_reference_out_of_a_hypothesis_folder(tmp_path, capsys):
    """A reference kept in the hypothesis folder was read as its own hypothesis: 0.00% DER without a word where
    no hypothesis named its recordings, "turns in two files" where one did."""
    from normlab.cli import main

    (tmp_path / "hyp").mkdir()
    write_rttm([Turn("a", 0, 10, "A"), Turn("b", 0, 10, "B")], tmp_path / "hyp" / "ref.rttm")
    write_rttm([Turn("a", 0, 10, "x")], tmp_path / "hyp" / "a.rttm")
    write_rttm([Turn("b", 0, 5, "y")], tmp_path / "hyp" / "b.rttm")
    assert main(["diarize", "score", str(tmp_path / "hyp" / "ref.rttm"), str(tmp_path / "hyp"), "--collar", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "DER: 25.00%"
    (tmp_path / "alone").mkdir()
    write_rttm([Turn("a", 0, 10, "A")], tmp_path / "alone" / "ref.rttm")
    assert main(["diarize", "score", str(tmp_path / "alone" / "ref.rttm"), str(tmp_path / "alone")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no .rttm files but the reference" in err[0], err


def test_cli_score_refuses_a_recording_in_two_files(tmp_path, capsys):
    """Turns of one recording in two hypothesis (or reference) files are an error naming both, not one merged
    hypothesis."""
    from normlab.cli import main

    write_rttm([T(0, 4, "A")], tmp_path / "ref.rttm")
    write_rttm([T(0, 2, "x")], tmp_path / "h1.rttm")
    write_rttm([T(2, 4, "y")], tmp_path / "h2.rttm")
    assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "h1.rttm"),
                 str(tmp_path / "h2.rttm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'a'" in err[0] and "h1.rttm" in err[0] and "h2.rttm" in err[0], err
    (tmp_path / "refs").mkdir()  # a folder of references, two of them with recording a
    write_rttm([T(0, 2, "A")], tmp_path / "refs" / "r1.rttm")
    write_rttm([T(2, 4, "A")], tmp_path / "refs" / "r2.rttm")
    assert main(["diarize", "score", str(tmp_path / "refs"), str(tmp_path / "h1.rttm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "r1.rttm" in err[0] and "r2.rttm" in err[0], err
    write_rttm([T(0, 4, "x", "b")], tmp_path / "hb.rttm")  # different recordings in several files: fine
    assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "h1.rttm"),
                 str(tmp_path / "hb.rttm"), "--collar", "0"]) == 0
    assert capsys.readouterr().out.startswith("DER: 50.00%")


def test_read_refuses_absurd_times(tmp_path, capsys):
    """Finite but absurd times (past 1e7 s, about 116 days) are a corrupt file, not a 300-digit total."""
    from normlab.cli import main

    for name, text in {"on": "SPEAKER a 1 1e300 1 <NA> <NA> A <NA> <NA>\n",
                       "dur": "SPEAKER a 1 0 1e300 <NA> <NA> A <NA> <NA>\n"}.items():
        (tmp_path / f"{name}.rttm").write_text(text)
        with pytest.raises(BadValue, match=rf"{name}.rttm:1: .*116 days"):
            read_rttm(tmp_path / f"{name}.rttm")
    (tmp_path / "far.uem").write_text("a 1 0 1e300\n")
    with pytest.raises(BadValue, match=r"far.uem:1: .*116 days"):
        read_uem(tmp_path / "far.uem")
    (tmp_path / "edge.rttm").write_text("SPEAKER a 1 1e7 1e7 <NA> <NA> A <NA> <NA>\n")
    assert read_rttm(tmp_path / "edge.rttm") == {"a": [Turn("a", 1e7, 1e7, "A")]}
    write_rttm([T(0, 4, "A")], tmp_path / "ok.rttm")
    assert main(["diarize", "score", str(tmp_path / "dur.rttm"), str(tmp_path / "ok.rttm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "116 days" in err[0], err


NAN = float("nan")


@pytest.mark.parametrize("call, message", [
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], collar=NAN), "collar"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], collar=-1.0), "collar"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], collar=float("inf")), "collar"),
    (lambda: score({}, {}, collar=NAN), "collar"),  # nothing to score is no reason to accept it
    (lambda: score({"a": [T(0, 4, "A")]}, {"a": [T(0, 4, "x")]}, collar=-0.5), "collar"),
    (lambda: diarization_error_rate([Turn("a", NAN, 1.0, "A")], [T(0, 4, "x")]), "start"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [Turn("a", 0.0, NAN, "x")]), "duration"),
    (lambda: diarization_error_rate([Turn("a", 1.0, -0.5, "A")], []), "duration"),
    (lambda: diarization_error_rate([Turn("a", "0", 1.0, "A")], []), "start"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], uem=[(3.0, 1.0)]), "ends before it starts"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], uem=[(0.0, NAN)]), "offset"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], uem={"a": [(0.0, 1.0)]}), "score()"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [T(0, 4, "x")], uem=[0.0, 1.0]), "pair"),
    (lambda: diarization_error_rate({"a": [T(0, 4, "A")]}, [T(0, 4, "x")]), "score()"),
    (lambda: diarization_error_rate([T(0, 4, "A")], [(0.0, 4.0, "x")]), "Turn"),
    (lambda: diarization_error_rate([T(0, 4, "A"), T(0, 4, "B", "b")], []), "recordings"),
    (lambda: score([T(0, 4, "A")], {"a": [T(0, 4, "x")]}), "{uri:"),
    (lambda: score({"a": [T(0, 4, "A")]}, {"a": [T(0, 4, "x")]}, uem=[(0.0, 1.0)]), "{uri:"),
    (lambda: score({"a": [T(0, 4, "A")]}, {"a": [T(0, 4, "x")]}, uem={"a": [(3.0, 1.0)]}), "ends before"),
])
def test_der_refuses_what_it_cannot_score(call, message):
    with pytest.raises(BadValue, match=re.escape(message)):
        call()


def test_der_scores_one_recording_whatever_the_hypothesis_names_it():
    """``diarize(waveform)`` names its turns "audio": a hypothesis under another uri than the reference's is
    still that recording's (the one-recording call scores what it is given)."""
    ref, hyp = [T(0, 10, "A"), T(10, 20, "B")], [T(0, 8, "s1", "audio"), T(8, 20, "s2", "audio")]
    assert diarization_error_rate(ref, hyp) == diarization_error_rate(ref, [T(0, 8, "s1"), T(8, 20, "s2")])


def test_frame_errors_refuse_a_step_that_is_not_a_number_of_seconds():
    from normlab.diarization.metrics.frame_errors import frame_errors

    for step in (NAN, float("inf"), 0.0):
        with pytest.raises(BadValue, match="step"):
            frame_errors([T(0, 4, "A")], [T(0, 4, "x")], step=step)


@pytest.mark.parametrize("turn", [Turn("a", 0.0, NAN, "A"), Turn("a", 0.0, -1.0, "A"), Turn("a", "0", 1.0, "A"),
                                  Turn("a", 0.0, 1e300, "A")])
def test_write_rttm_refuses_what_read_rttm_would(tmp_path, turn):
    with pytest.raises(BadValue, match="start|duration"):
        write_rttm([T(0, 1, "A"), turn], tmp_path / "x.rttm")
    assert not (tmp_path / "x.rttm").exists()  # nothing written


@pytest.mark.parametrize("regions", [{"a": [(3.0, 1.0)]}, {"a": [(NAN, 1.0)]}, {"a": [(0.0, NAN)]},
                                     {"a": [(-1.0, 1.0)]}, {"a": [(0.0, 1.0, 2.0)]}, [(0.0, 1.0)]])
def test_write_uem_refuses_what_read_uem_would(tmp_path, regions):
    with pytest.raises(BadValue):
        write_uem(regions, tmp_path / "x.uem")
    assert not (tmp_path / "x.uem").exists()


def test_uem_line_of_the_wrong_number_of_fields_says_so(tmp_path, capsys):
    from normlab.cli import main

    (tmp_path / "few.uem").write_text("; scored regions\na 1 0\n")
    with pytest.raises(BadValue, match=r"few.uem:2: .*expected 4 fields \(uri channel onset offset\), got 3"):
        read_uem(tmp_path / "few.uem")
    write_rttm([T(1, 4, "A")], tmp_path / "ref.rttm")
    for uem in ("few.uem", "ref.rttm"):  # an RTTM file given as the UEM: 10 fields
        assert main(["diarize", "score", str(tmp_path / "ref.rttm"), str(tmp_path / "ref.rttm"),
                     "--uem", str(tmp_path / uem)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{uem}:" in err[0] and "expected 4 fields" in err[0], err


def test_what_was_scored_silently_wrong_is_refused_or_right():
    """skip_overlap="no" was true (overlap left out); a speaker None beside "A" failed inside sorted(); sum() of
    results failed at 0 + a result."""

    ref, hyp = [T(0, 5, "A"), T(4, 8, "B")], [T(0, 4.5, "x"), T(4.5, 8, "y")]
    with pytest.raises(TypeError, match="skip_overlap must be True or False, got 'no'"):
        diarization_error_rate(ref, hyp, skip_overlap="no")
    with pytest.raises(BadValue, match="its uri and speaker must be strings"):
        diarization_error_rate([T(0, 1, None), T(2, 3, "A")], hyp)
    one = diarization_error_rate(ref, hyp)
    assert sum([one, one]).total == 2 * one.total == (one + one).total
    with pytest.raises(TypeError):
        one + 1


def test_exclusive_turns_reads_a_generator_and_refuses_what_it_dropped():
    """A generator gave [] (it was read twice); a turn of negative or NaN length was dropped and another
    recording's turn cut this one's, silently."""
    from normlab.diarization import exclusive_turns

    turns = [T(0, 2, "A"), T(1, 3, "B")]
    assert exclusive_turns(t for t in turns) == exclusive_turns(turns) == [T(0, 2, "A"), T(2, 3, "B")]
    for bad, says in (([Turn("a", 1.0, -0.5, "A"), T(0, 2, "B")], "duration"),
                      ([Turn("a", NAN, 1.0, "A")], "start"), ([T(0, 2, "A"), T(1, 3, "B", uri="b")], "2 recordings")):
        with pytest.raises(BadValue, match=says):
            exclusive_turns(bad)


def test_annotation_labels_that_would_become_one_speaker_are_refused():
    """'spk A' and 'spk_A' (and 1 and '1') became one speaker, silently: the DER changed."""
    core = pytest.importorskip("pyannote.core", reason="pyannote.core is an optional extra (normlab[annotation])")
    from normlab.diarization import from_annotation, to_annotation

    ann = core.Annotation(uri="m")
    ann[core.Segment(0, 1)] = "spk A"
    ann[core.Segment(1, 2)] = "spk_A"
    with pytest.raises(BadValue, match="speaker labels 'spk A' and 'spk_A' both become 'spk_A'"):
        from_annotation(ann)
    with pytest.raises(BadValue, match="duration"):
        to_annotation([Turn("a", 2.0, -1.0, "A"), T(0, 1, "B")])
    with pytest.raises(TypeError, match="not a {uri: turns} table"):
        to_annotation({"a": [T(0, 1, "A")]})


def test_a_diarization_is_what_its_docstring_says_or_refused(tmp_path):
    """A uri other than its turns', two recordings' turns, a NaN duration (its JSON then failed) and an
    is_exclusive of "no" were taken; write_rttm of one Turn read its fields as turns."""
    from normlab.diarization import Diarization

    for kw, error, says in (({"turns": [T(0, 2, "A")], "uri": "zz"}, ValueError, "turns of 'a' too"),
                            ({"turns": [T(0, 2, "A"), T(1, 3, "B", uri="b")]}, ValueError, "turns of 'b' too"),
                            ({"turns": [], "uri": "a b"}, ValueError, "uri must be non-empty and without spaces"),
                            ({"turns": [T(0, 2, "A")], "duration": NAN}, ValueError, "duration"),
                            ({"turns": [T(0, 2, "A")], "is_exclusive": "no"}, TypeError, "is_exclusive")):
        with pytest.raises(error, match=says):
            Diarization(kw.pop("turns"), **kw)
    assert Diarization([T(0, 2, "A")], duration=3.0).to_json()
    with pytest.raises(TypeError, match="a list of turns, not one Turn"):
        write_rttm(T(0, 1, "A"), tmp_path / "y.rttm")
    with pytest.raises(BadValue, match="is a folder where the RTTM file goes"):
        write_rttm([T(0, 1, "A")], tmp_path)


def test_to_turns_and_pit_bce_name_what_they_cannot_take():
    """to_turns: a NaN threshold gave no turns and two equal labels one speaker, silently; a 1-D probs or a float
    median failed inside torch. pit_bce: labels of 2 gave a loss; a 2-D batch failed unpacking a tuple."""
    from normlab.diarization import pit_bce, to_turns

    p = torch.tensor([[0.9, 0.1]] * 20 + [[0.1, 0.9]] * 20)
    assert {t.speaker for t in to_turns(p, 0.1, "a", median=1)} == {"spk0", "spk1"}
    for kw, error, says in (({"threshold": NAN}, ValueError, "threshold"), ({"labels": ["A", "A"]}, ValueError,
                            "each of the 2 speakers once"), ({"median": 3.0}, TypeError, "median")):
        with pytest.raises(error, match=says):
            to_turns(p, 0.1, "a", **{"median": 1, **kw})
    with pytest.raises(TypeError, match=r"probs must be a floating-point tensor \(frames, speakers\)"):
        to_turns(p[:, 0], 0.1, "a")
    logits, labels = torch.randn(2, 5, 3), (torch.rand(2, 5, 3) > 0.5).float()
    for args, says in (((logits, labels * 2), "labels must be 0 or 1"), ((logits[0], labels[0]), "batch, frames"),
                       ((logits, labels, torch.zeros(2, 4, dtype=torch.bool)), r"padding mask has shape \[2, 4\]")):
        with pytest.raises(ValueError, match=says):
            pit_bce(*args)
