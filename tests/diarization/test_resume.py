"""A stopped ``diarize`` or ``evaluate`` resumes: what the same inputs made is kept, not diarized again; anything
that changed (the audio, a setting, the model, an edited output) is made again. Debug-sized models (fast)."""
import json

import pytest
import soundfile as sf

from normlab import written
from normlab.cli import main
from normlab.diarization import Turn, diarize_files, read_rttm, write_rttm
from normlab.diarization.pipeline import api
from tiny_diarizer import SR, tiny_models, tones


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    tiny_models(d, 2.0, threshold=0.55, median=5, window=4.0, step=2.0, cluster_threshold=0.3, speakers="eend",
                vad="off")
    (d / "wav").mkdir()
    sf.write(d / "wav" / "a.wav", tones(10), SR)
    sf.write(d / "wav" / "b.wav", tones(8, seed=1), SR)
    return d


def _run(d, out, paths=None, **kw):
    """diarize_files over ``paths`` (default: both files); ``(status, {path: result}, files diarized)``."""
    seen, results = [], {}
    real = api._diarize

    def counting(p, *a, **k):
        seen.append(p.name)
        return real(p, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_diarize", counting)
        status = diarize_files(paths or sorted((d / "wav").glob("*.wav")), out, model=d / "m.pt",
                               embedding=d / "enc.pt", on_result=results.__setitem__, **kw)
    return status, results, seen


@pytest.mark.parametrize("fmt", ["rttm", "json"])
def test_a_rerun_keeps_what_the_same_inputs_made_and_reads_it_back(files, tmp_path, fmt):
    first, made, seen = _run(files, tmp_path, format=fmt)
    assert set(first.values()) == {"ok"} and seen == ["a.wav", "b.wav"]
    again, kept, seen = _run(files, tmp_path, format=fmt)
    assert set(again.values()) == {"kept"} and seen == []
    for p, r in made.items():  # the result read back is the one written: turns (to the ms), duration, settings
        k = kept[p]
        assert k.uri == r.uri and k.duration == r.duration and k.settings == r.settings
        assert k.provenance == r.provenance and k.speakers == r.speakers and len(k) == len(r) > 0
        assert [(round(t.start, 3), round(t.end, 3), t.speaker) for t in k] == \
            [(round(t.start, 3), round(t.end, 3), t.speaker) for t in r]


def test_a_run_stopped_after_one_file_resumes_at_the_next(files, tmp_path, monkeypatch):
    real = api._diarize

    def stop_at_b(p, *a, **k):
        if p.name == "b.wav":
            raise KeyboardInterrupt
        return real(p, *a, **k)

    monkeypatch.setattr(api, "_diarize", stop_at_b)
    with pytest.raises(KeyboardInterrupt):
        diarize_files(sorted((files / "wav").glob("*.wav")), tmp_path, model=files / "m.pt",
                      embedding=files / "enc.pt")
    monkeypatch.undo()
    status, _, seen = _run(files, tmp_path)
    assert seen == ["b.wav"] and [status[str(files / "wav" / n)] for n in ("a.wav", "b.wav")] == ["kept", "ok"]


def test_what_changed_is_made_again(files, tmp_path):
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path, a)
    assert _run(files, tmp_path, a, num_speakers=2)[2] == ["a.wav"]  # a setting
    assert _run(files, tmp_path, a, num_speakers=2)[2] == []
    assert _run(files, tmp_path, a, num_speakers=2, exclusive=True)[2] == ["a.wav"]  # the turns written
    other = tmp_path / "other"
    other.mkdir()
    sf.write(other / "a.wav", tones(10, seed=5), SR)  # the same name, other audio
    assert _run(files, tmp_path, [other / "a.wav"], num_speakers=2, exclusive=True)[2] == ["a.wav"]
    out = tmp_path / "a.rttm"
    out.write_text(out.read_text() + "\n")  # an output edited since: the user's now, replaced only when asked
    with pytest.raises(ValueError, match="did not write it"):
        _run(files, tmp_path, [other / "a.wav"], num_speakers=2, exclusive=True)
    status, _, seen = _run(files, tmp_path, [other / "a.wav"], num_speakers=2, exclusive=True, overwrite=True)
    assert seen == ["a.wav"] and set(status.values()) == {"ok"}


def test_another_model_file_is_made_again(files, tmp_path):
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path, a)
    changed = tmp_path / "m2"
    changed.mkdir()
    tiny_models(changed, 1.0, threshold=0.55, median=5, window=4.0, step=2.0, cluster_threshold=0.3,
                speakers="eend", vad="off")
    seen = []
    real = api._diarize
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_diarize", lambda p, *x, **k: seen.append(p.name) or real(p, *x, **k))
        assert diarize_files(a, tmp_path, model=changed / "m.pt", embedding=files / "enc.pt") == {str(a[0]): "ok"}
    assert seen == ["a.wav"]


def test_a_timeline_asked_for_on_the_rerun_is_made(files, tmp_path):
    pytest.importorskip("matplotlib")
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path, a)
    assert _run(files, tmp_path, a, plot=True)[2] == ["a.wav"] and (tmp_path / "a.png").is_file()
    assert _run(files, tmp_path, a, plot=True)[2] == []
    (tmp_path / "a.png").unlink()
    assert _run(files, tmp_path, a, plot=True)[2] == ["a.wav"]


def test_the_command_says_what_it_kept(files, tmp_path, capsys):
    argv = ["diarize", str(files / "wav" / "a.wav"), "--model", str(files / "m.pt"), "--embedding",
            str(files / "enc.pt"), "--out", str(tmp_path)]
    assert main(argv) == 0 and ": wrote " in capsys.readouterr().out
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{files / 'wav' / 'a.wav'}: kept {tmp_path / 'a.rttm'}, made from the same audio and settings (" in out
    assert "speaker" in out


def test_evaluate_scores_what_it_kept_as_what_it_made(files, tmp_path, monkeypatch):
    from normlab.diarization.metrics.evaluate import evaluate_folder

    ref = tmp_path / "ref.rttm"
    write_rttm([Turn(u, s, 2.0, f"v{int(s) // 2 % 2}") for u in ("a", "b") for s in range(0, 8, 2)], ref)
    kw = dict(model=files / "m.pt", embedding=files / "enc.pt")
    first = evaluate_folder(files / "wav", ref, tmp_path / "hyp", **kw)
    monkeypatch.setattr(api, "_diarize", lambda *a, **k: pytest.fail("a kept file was diarized again"))
    again = evaluate_folder(files / "wav", ref, tmp_path / "hyp", **kw)
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True) and not again["errors"]
    assert read_rttm(tmp_path / "hyp" / "a.rttm")["a"]


def test_the_list_keeps_each_files_note_until_it_is_written_without_one(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    written.write_text(a, "1", {"key": "x"})
    written.write_text(b, "2", {"key": "y"})
    assert written.made(a) == {"key": "x"} and written.made(b) == {"key": "y"}
    written.write_text(b, "3")  # written again without a note: the old note was of other contents
    assert written.made(b) is None and written.made(a) == {"key": "x"} and written.listed(tmp_path)["b.txt"]
    a.write_text("edited")
    assert written.made(a) is None  # changed since: not what the note describes
    (tmp_path / written.LIST).write_text("[not a list")
    assert written.made(a) is None and written.listed(tmp_path) == {}
