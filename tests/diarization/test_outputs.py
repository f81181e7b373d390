"""What diarize returns and writes: the ``Diarization`` result, exclusive turns, ``--format json``, ``--exclusive``,
``--plot`` and ``evaluate --html``, with a debug-sized model and a random-weight speaker encoder (fast)."""
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.cli import main
from normlab.diarization import (
    Diarization,
    Turn,
    diarize,
    exclusive_turns,
    read_rttm,
    write_rttm,
)
from normlab.diarization.metrics.der import merge
from normlab.diarization.models.weights import sha256
from tiny_diarizer import SR, tiny_models, tones


def _overlaps(turns) -> float:
    """Seconds where two or more turns (any speakers) are active."""
    cuts = sorted({b for t in turns for b in (t.start, t.end)})
    return sum(b - a for a, b in zip(cuts, cuts[1:]) if sum(t.start <= (a + b) / 2 < t.end for t in turns) > 1)


def test_exclusive_turns_keep_the_speaker_already_talking():
    t = lambda s, e, who: Turn("u", s, e - s, who)  # noqa: E731
    assert exclusive_turns([t(0, 4, "A"), t(3, 8, "B")]) == [t(0, 4, "A"), t(4, 8, "B")]
    assert exclusive_turns([t(0, 10, "A"), t(2, 5, "B")]) == [t(0, 10, "A")]  # an interjection gives way
    assert exclusive_turns([t(2, 5, "B"), t(2, 3, "A")]) == [t(2, 3, "A"), t(3, 5, "B")]  # a tie: by name
    # after a silence nobody holds the floor: the turn that began first wins
    assert exclusive_turns([t(0, 1, "A"), t(2, 6, "B"), t(3, 5, "A")]) == [t(0, 1, "A"), t(2, 6, "B")]
    assert exclusive_turns([]) == []


def test_exclusive_turns_cover_exactly_the_speech_and_never_overlap():
    rng = np.random.default_rng(0)
    turns = [Turn("u", float(s), float(d), f"s{rng.integers(4)}")
             for s, d in zip(rng.uniform(0, 100, 60).round(1), rng.uniform(0.2, 8, 60).round(1))]
    ex = exclusive_turns(turns)
    assert _overlaps(turns) > 10 and _overlaps(ex) == 0
    union = lambda ts: [(round(a, 6), round(b, 6)) for a, b in merge((x.start, x.end) for x in ts)]  # noqa: E731
    assert union(ex) == union(turns)
    for x in ex:  # each exclusive piece belongs, throughout, to a speaker who was talking then
        for m in np.linspace(x.start, x.end, 9)[1:-1]:
            assert any(o.speaker == x.speaker and o.start <= m < o.end for o in turns), (x, m)


def test_speakers_who_stop_on_the_same_frame_give_no_empty_turn():
    """Turns are made as start + duration, so two speakers who stop on the same frame end an ulp apart: the
    exclusive turns handed that 4e-16 s gap to the speaker who never held the floor (a 0.000 s RTTM line)."""
    from normlab.diarization.pipeline.postprocess import to_turns

    for a, b in [(3, 4), (1, 7), (2, 5), (5, 6), (0, 9)]:
        for end in range(10, 30):
            p = torch.zeros(33, 2)
            p[a:end, 0], p[b:end, 1] = 1, 1
            ex = exclusive_turns(to_turns(p, 0.1, "u", median=1))
            assert [x.speaker for x in ex] == ["spk0"], (a, b, end, ex)
            assert abs(ex[0].start - a * 0.1) < 1e-9 and abs(ex[0].end - end * 0.1) < 1e-9


def test_the_result_is_a_list_of_turns_with_rttm_and_json():
    turns = [Turn("rec", 1.0, 2.0, "b"), Turn("rec", 0.5, 1.0, "a")]
    d = Diarization(turns, settings={"threshold": 0.5}, provenance={"normlab": "x"}, duration=4.0)
    assert d == sorted(turns) and d.turns == sorted(turns) and isinstance(d, list) and d.uri == "rec"
    assert d.to_rttm().splitlines()[0] == "SPEAKER rec 1 0.500 1.000 <NA> <NA> a <NA> <NA>"
    blob = json.loads(d.to_json())
    assert blob["uri"] == "rec" and blob["settings"] == {"threshold": 0.5} and blob["provenance"] == {"normlab": "x"}
    assert blob["turns"] == [{"uri": "rec", "start": 0.5, "end": 1.5, "speaker": "a"},
                             {"uri": "rec", "start": 1.0, "end": 3.0, "speaker": "b"}]
    ex = d.exclusive()
    assert ex.is_exclusive and not d.is_exclusive and json.loads(ex.to_json())["exclusive"] is True
    assert [(x.start, x.end, x.speaker) for x in ex] == [(0.5, 1.5, "a"), (1.5, 3.0, "b")]


def test_a_diarization_checks_its_turns_and_writes_strict_json():
    d = Diarization([Turn("rec", np.float32(0.5), np.float64(1.25), "a")])
    assert json.loads(d.to_json())["turns"] == [{"uri": "rec", "start": 0.5, "end": 1.75, "speaker": "a"}]
    for bad in (Turn("rec", float("nan"), 1.0, "a"), ("rec", 0.0, 1.0, "a")):
        with pytest.raises(ValueError, match="start|Turn"):
            Diarization([bad])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("outputs")
    tiny_models(d, 2.0, threshold=0.55, median=5, window=4.0, step=2.0, cluster_threshold=0.3, speakers="eend",
                vad="off")  # says "speech" often
    (d / "wav").mkdir()
    sf.write(d / "wav" / "talk.wav", tones(10), SR)
    return d


def test_diarize_returns_settings_provenance_and_exclusive_turns(files):
    d = files
    full = diarize(d / "wav" / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt")
    assert isinstance(full, Diarization) and full
    assert full.provenance["model"]["sha256"] == sha256(d / "m.pt")
    assert full.provenance["embedding"]["sha256"] == sha256(d / "enc.pt") and full.provenance["vad"] is None
    assert full.settings["speakers"] == "eend" and full.settings["threshold"] == 0.55 and full.duration == 10.0
    ex = diarize(d / "wav" / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt", exclusive=True)
    assert ex.is_exclusive and ex == full.exclusive() and ex.provenance == full.provenance


#: what the pipeline is made to return below: two speakers overlapping for 2 s
OVERLAPPING = [Turn("talk", 0.5, 4.0, "spk0"), Turn("talk", 2.5, 5.0, "spk1")]


def test_exclusive_and_json_reach_the_written_file(files, tmp_path, monkeypatch):
    """The pipeline's turns (made to overlap here) go through --exclusive and --format into the file."""
    from normlab.diarization.pipeline import api

    monkeypatch.setattr(api, "diarize_waveform", lambda *a, **k: list(OVERLAPPING))
    d = files
    argv = ["diarize", str(d / "wav" / "talk.wav"), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt")]
    assert main([*argv, "--out", str(tmp_path / "x"), "--format", "json", "--exclusive"]) == 0
    blob = json.loads((tmp_path / "x" / "talk.json").read_text())
    assert [(t["start"], t["end"], t["speaker"]) for t in blob["turns"]] == [(0.5, 4.5, "spk0"), (4.5, 7.5, "spk1")]
    assert main([*argv, "--out", str(tmp_path / "y")]) == 0
    assert read_rttm(tmp_path / "y" / "talk.rttm")["talk"] == OVERLAPPING  # the default keeps the overlap
    assert list(diarize(d / "wav" / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt", exclusive=True)) == \
        exclusive_turns(OVERLAPPING)


def test_cli_writes_json_exclusive_and_a_timeline(files, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    d = files
    argv = ["diarize", str(d / "wav" / "talk.wav"), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt")]
    assert main([*argv, "--out", str(tmp_path / "j"), "--format", "json", "--exclusive", "--plot"]) == 0
    assert "wrote" in capsys.readouterr().out and not (tmp_path / "j" / "talk.rttm").exists()
    blob = json.loads((tmp_path / "j" / "talk.json").read_text())
    assert blob["exclusive"] is True and blob["uri"] == "talk" and blob["settings"]["median"] == 5
    turns = [Turn(x["uri"], x["start"], x["end"] - x["start"], x["speaker"]) for x in blob["turns"]]
    assert turns and _overlaps(turns) < 1e-6
    assert blob["provenance"]["embedding"]["sha256"] == sha256(d / "enc.pt")
    img = matplotlib.image.imread(tmp_path / "j" / "talk.png")
    assert img.shape[1] == 1200 and img.shape[0] > 100
    from PIL import Image

    made = json.loads(Image.open(tmp_path / "j" / "talk.png").text["Description"])  # the timeline says what made it
    assert made["settings"] == blob["settings"] and made["pipeline"] == blob["provenance"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0  # the default: RTTM
    rttm = read_rttm(tmp_path / "r" / "talk.rttm")["talk"]
    assert [(round(t.start, 3), round(t.end, 3)) for t in exclusive_turns(rttm)] == \
        [(round(t.start, 3), round(t.end, 3)) for t in turns]
    assert main([*argv, "--format", "xml"]) == 2 and "invalid choice" in capsys.readouterr().err


def test_cli_evaluate_writes_one_page_with_every_recording(files, tmp_path, capsys):
    d = files
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 10, 2)], ref)
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), "--model", str(d / "m.pt"), "--embedding",
                 str(d / "enc.pt"), "--out", str(tmp_path / "hyp"), "--html", str(tmp_path / "page")]) == 0
    assert f"wrote {tmp_path / 'page' / 'index.html'}" in capsys.readouterr().out
    page = (tmp_path / "page" / "index.html").read_text()
    svg = page[page.index("<svg") : page.index("</svg>") + 6]
    rows = ET.fromstring(svg).findall("{http://www.w3.org/2000/svg}g")
    refs = [g.get("data-speaker") for g in rows if g.get("class") == "row reference"]
    hyps = [g.get("data-speaker") for g in rows if g.get("class") == "row hypothesis"]
    assert refs == ["v0", "v1"] and sorted(hyps) == sorted({t.speaker for t in read_rttm(tmp_path / "hyp" /
                                                                                          "talk.rttm")["talk"]})
    assert 'id="talk"' in page and "<table" in page
    # the table's speaker counts: the reference's 2, the hypothesis's, and whether they agree
    assert f"<td>2 / {len(hyps)}</td>" in page and f"<td>right on {int(len(hyps) == 2)} of 1</td>" in page
    from normlab import __version__
    from normlab.diarization.models.weights import sha256

    assert f"Made with normlab {__version__}" in page and sha256(d / "m.pt") in page  # what made it (it said nothing)


def test_cli_evaluate_page_shows_this_run_and_json_stays_json(files, tmp_path, capsys):
    """With --json and --html, "wrote page/index.html" followed the JSON on stdout (no JSON reader took it); the
    page drew the hypothesis a failed file had left from an earlier run, beside this run's 100% missed; and it
    named no settings."""
    import shutil

    d = files
    wav = tmp_path / "wav"
    shutil.copytree(d / "wav", wav)
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 10, 2)], ref)
    argv = ["diarize", "evaluate", str(wav), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
            "--out", str(tmp_path / "hyp"), "--html", str(tmp_path / "page")]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["html"] == str(tmp_path / "page" / "index.html")
    page = (tmp_path / "page" / "index.html").read_text()
    assert "&quot;threshold&quot;: 0.55" in page and "row hypothesis" in page
    (wav / "talk.wav").write_bytes(b"RIFF" + bytes(3000))  # this run cannot read it: all of it missed
    assert main(argv) == 1
    capsys.readouterr()
    page = (tmp_path / "page" / "index.html").read_text()
    assert "row hypothesis" not in page and "confusion 0.00 s" in page


def test_a_recording_without_scored_speech_reads_na_across():
    """A recording whose reference speech all lies inside the collars: its row read DER n/a beside false alarm
    "200.00%" (2 s of false alarm over a total taken as 1)."""
    from normlab.diarization.metrics.report_html import der_table

    row = {c: {"der": None, "false_alarm": 2.0, "missed": 0.0, "confusion": 0.0, "total": 0.0} for c in ("0.25",)}
    table = der_table({"files": [{"uri": "r", "collars": row}], "total": row, "errors": {}})
    assert "%" not in table and table.count("<td>n/a</td>") == 8, table  # the recording's row and the total


def test_without_matplotlib_plot_stops_before_any_work(files, tmp_path, capsys, no_matplotlib):
    d = files
    rc = main(["diarize", str(d / "wav" / "talk.wav"), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
               "--out", str(tmp_path / "p"), "--plot"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.endswith("pip install 'normlab[plot]'") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "p").exists()


def test_files_normlab_did_not_write_are_never_replaced(files, tmp_path, capsys):
    """A reference kept in the output folder, one beside a linked recording, a page of the user's own: each stops
    the command before any work (exit 2, one line); normlab's own unchanged output is replaced on a rerun, an
    edited one is not, and --overwrite replaces any."""
    d = files
    args = ["--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt")]
    refs = tmp_path / "refs"
    refs.mkdir()
    ref = refs / "talk.rttm"
    write_rttm([Turn("talk", 0.0, 2.0, "v0")], ref)
    kept = ref.read_text()
    # evaluate writing its hypotheses where the reference is (the reference is named like the recording)
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), *args, "--out", str(refs)]) == 2
    err = capsys.readouterr().err.strip()
    assert "talk.rttm is the reference this evaluation reads" in err and len(err.splitlines()) == 1, err
    assert ref.read_text() == kept
    # a recording reached through a link: its reference beside the link is beside its audio
    linked = tmp_path / "proj"
    linked.mkdir()
    (linked / "talk.wav").symlink_to(d / "wav" / "talk.wav")
    (linked / "talk.rttm").write_text(kept)
    assert main(["diarize", str(linked / "talk.wav"), *args, "--out", str(linked)]) == 2
    assert "exists beside its audio" in capsys.readouterr().err and (linked / "talk.rttm").read_text() == kept
    # the page of evaluate --html
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>mine</p>")
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), *args, "--out", str(tmp_path / "h"), "--html",
                 str(site)]) == 2
    assert "index.html exists and normlab did not write it" in capsys.readouterr().err
    assert (site / "index.html").read_text() == "<p>mine</p>" and not (tmp_path / "h").exists()
    # normlab's own output: replaced on a rerun; edited by hand: kept, unless --overwrite
    out = tmp_path / "o"
    run = ["diarize", str(d / "wav" / "talk.wav"), *args, "--out", str(out)]
    assert main(run) == 0 and main(run) == 0
    (out / "talk.rttm").write_text(kept)
    assert main(run) == 2 and (out / "talk.rttm").read_text() == kept
    assert main([*run, "--overwrite"]) == 0 and (out / "talk.rttm").read_text() != kept
    capsys.readouterr()


def test_a_speaker_count_that_cannot_be_met_is_said(files):
    """--num-speakers 20 on a recording where fewer ever win a frame: the result has fewer, and says so (one
    line on the command line)."""
    d = files
    with pytest.warns(UserWarning, match="found where exactly 20 were asked for"):
        result = diarize(d / "wav" / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt", num_speakers=20)
    assert 0 < len({t.speaker for t in result}) < 20
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "normlab", "diarize", str(d / "wav" / "talk.wav"), "--model",
                        str(d / "m.pt"), "--embedding", str(d / "enc.pt"), "--out", str(d / "many"),
                        "--num-speakers", "20"], capture_output=True, text=True, timeout=300)
    err = [x for x in r.stderr.splitlines() if "warning" in x]
    assert r.returncode == 0 and len(err) == 1 and err[0].startswith("normlab diarize run: warning: talk: "), r.stderr


def test_evaluate_with_a_uem_of_other_recordings_stops_before_any_work(files, tmp_path, capsys):
    d = files
    ref, uem = tmp_path / "ref.rttm", tmp_path / "other.uem"
    write_rttm([Turn("talk", 0.0, 2.0, "v0")], ref)
    uem.write_text("elsewhere 1 0.000 10.000\n")
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), "--model", str(d / "m.pt"), "--embedding",
                 str(d / "enc.pt"), "--out", str(tmp_path / "hyp"), "--uem", str(uem)]) == 2
    assert "other.uem covers none of the recordings of" in capsys.readouterr().err
    assert not (tmp_path / "hyp").exists()
    # a UEM of a recording the folder has but the reference does not name: nothing would be scored either (it
    # read DER 0.00% once such recordings were no longer scored)
    stray = tmp_path / "wavs"
    stray.mkdir()
    for name in ("talk", "stray"):
        (stray / f"{name}.wav").write_bytes((d / "wav" / "talk.wav").read_bytes())
    uem.write_text("stray 1 0.000 10.000\n")
    assert main(["diarize", "evaluate", str(stray), str(ref), "--model", str(d / "m.pt"), "--embedding",
                 str(d / "enc.pt"), "--out", str(tmp_path / "hyp"), "--uem", str(uem)]) == 2
    assert "covers none of the recordings of" in capsys.readouterr().err
    assert not (tmp_path / "hyp").exists()


def test_evaluate_never_writes_over_the_reference_it_scores(files, tmp_path, capsys):
    """With --overwrite, a reference RTTM named like the recording inside --out was replaced by the hypothesis,
    and the same command then scored it against itself (a second run read 0.00%)."""
    d = files
    ref = tmp_path / "talk.rttm"
    write_rttm([Turn("talk", 0.0, 2.0, "v0")], ref)
    before = ref.read_bytes()
    args = ["--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"), "--overwrite"]
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), *args, "--out", str(tmp_path)]) == 2
    assert f"{ref} is the reference this evaluation reads, and an output would replace it: give another --out" \
        in capsys.readouterr().err
    assert ref.read_bytes() == before
    assert main(["diarize", "evaluate", str(d / "wav"), str(ref), *args, "--uem", "", "--out", str(tmp_path)]) == 2
    assert "--uem: expected a path, got an empty one" in capsys.readouterr().err


def test_a_fault_in_the_model_file_s_settings_names_the_file(files, tmp_path, capsys):
    """An even median stored in the model file: one line naming the model file, before any audio (it was
    reported against each audio file, as if the recording were at fault)."""
    import torch

    d = files
    blob = torch.load(d / "m.pt", weights_only=True)
    blob["postprocess"]["median"] = 4
    torch.save(blob, tmp_path / "even.pt")
    rc = main(["diarize", str(d / "wav" / "talk.wav"), "--model", str(tmp_path / "even.pt"), "--embedding",
               str(d / "enc.pt"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "even.pt: its stored pipeline settings: median must be" in err[0], err
    assert main(["diarize", str(d / "wav" / "talk.wav"), "--model", str(tmp_path / "even.pt"), "--embedding",
                 str(d / "enc.pt"), "--out", str(tmp_path / "o"), "--median", "5"]) == 0  # the user's value wins


def test_numpy_numbers_in_the_settings_are_written_as_json_numbers():
    """``diarize(..., max_speakers=np.int64(3))`` is accepted; its ``to_json()`` raised TypeError, and
    ``diarize_files(format="json")`` stopped the whole batch after the first file."""
    from normlab.diarization.pipeline.output import Diarization

    d = Diarization([], uri="x", settings={"max_speakers": np.int64(3), "threshold": np.float32(0.5),
                                           "whiten": np.bool_(False), "grid": [np.int64(1)],
                                           "cuts": np.array([0.5, 0.25])})
    assert json.loads(d.to_json())["settings"] == {"max_speakers": 3, "threshold": 0.5, "whiten": False,
                                                   "grid": [1], "cuts": [0.5, 0.25]}
