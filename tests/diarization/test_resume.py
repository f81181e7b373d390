"""A stopped ``diarize`` or ``evaluate`` resumes: what the same inputs made is kept, not diarized again; anything
that changed (the audio, a setting, the model, an edited output) is made again. Debug-sized models (fast)."""
import json
import pathlib

import numpy as np
import pytest
import soundfile as sf
import torch

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
        seen.append(pathlib.Path(p).name)
        return real(p, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_diarize", counting)
        kw = {"model": d / "m.pt", "embedding": d / "enc.pt", **kw}
        status = diarize_files(paths or sorted((d / "wav").glob("*.wav")), out, on_result=results.__setitem__, **kw)
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


def test_modules_given_as_objects_are_keyed_by_what_they_hold(files, tmp_path):
    """A model or encoder given as an object has no file to name: every such model shared one key, and a rerun
    with other weights kept the first one's turns."""
    from normlab.diarization.pipeline.api import load_encoder, load_model

    a = [files / "wav" / "a.wav"]
    model, enc = load_model(files / "m.pt"), load_encoder(files / "enc.pt")
    kw = dict(model=model, embedding=enc)
    assert _run(files, tmp_path, a, **kw)[2] == ["a.wav"] and _run(files, tmp_path, a, **kw)[2] == []
    with torch.no_grad():
        model.head.bias.fill_(-2.0)  # changed in memory: another model
    assert _run(files, tmp_path, a, **kw)[2] == ["a.wav"] and _run(files, tmp_path, a, **kw)[2] == []
    with torch.no_grad():
        next(enc.parameters()).add_(1.0)
    assert _run(files, tmp_path, a, **kw)[2] == ["a.wav"]
    model.whitening = {"matrix": torch.eye(256)}  # held beside the state dict: a map of the embeddings
    assert _run(files, tmp_path, a, **kw)[2] == ["a.wav"] and _run(files, tmp_path, a, **kw)[2] == []
    model.whitening = {"matrix": 2 * torch.eye(256)}
    assert _run(files, tmp_path, a, **kw)[2] == ["a.wav"]
    from normlab.diarization.pipeline.api import _weights_digest

    model.whitening = {"matrix": torch.eye(256), "plda": {"mean": np.zeros(4)}}  # numpy inside: its bytes
    before = _weights_digest(model)
    model.whitening["plda"]["mean"][2] = 1.0
    assert _weights_digest(model) != before


def test_a_model_file_replaced_with_its_old_time_is_read_again(files, tmp_path):
    """The file's SHA-256 was remembered by its path and modification time: a copy that kept the old time (cp -p)
    was taken for the old file, its outputs kept, and its results named the old file's SHA-256."""
    import os

    from normlab.diarization.models.weights import sha256

    model = tmp_path / "m.pt"
    model.write_bytes((files / "m.pt").read_bytes())
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path / "out", a, model=model)
    before = os.stat(model)
    other = tmp_path / "other"
    other.mkdir()
    tiny_models(other, -1.0, threshold=0.55, median=5, window=4.0, step=2.0, cluster_threshold=0.3,
                speakers="eend", vad="off")
    model.write_bytes((other / "m.pt").read_bytes())
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    _, results, seen = _run(files, tmp_path / "out", a, model=model)
    assert seen == ["a.wav"] and results[str(a[0])].provenance["model"]["sha256"] == sha256(model)


def test_a_note_edited_by_hand_is_made_again(files, tmp_path):
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path, a)
    listed = json.loads((tmp_path / written.LIST).read_text())
    for bad in (None, "10.0", float("nan"), -1.0, True):
        listed["made"]["a.rttm"]["duration"] = bad
        (tmp_path / written.LIST).write_text(json.dumps(listed))
        status, _, seen = _run(files, tmp_path, a)
        assert seen == ["a.wav"] and set(status.values()) == {"ok"}, bad


def test_a_stop_between_writing_and_listing_leaves_an_output_the_rerun_takes(files, tmp_path, monkeypatch):
    """The output was moved into place, then listed: a stop between the two left a file the rerun refused as the
    user's ("exists and normlab did not write it")."""
    a = [files / "wav" / "a.wav"]
    _run(files, tmp_path, a)
    real = written.record

    def stopped(path, made=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(written, "record", stopped)  # moved into place with other settings, never listed
    with pytest.raises(KeyboardInterrupt):
        _run(files, tmp_path, a, num_speakers=1)
    monkeypatch.setattr(written, "record", real)
    assert _run(files, tmp_path, a, num_speakers=1)[2] == []  # it is what these settings made: kept
    import os

    real_replace = os.replace

    def stop_at_the_move(src, dst):  # stopped before the move: the old output stays, and is normlab's
        if str(dst).endswith("a.rttm"):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", stop_at_the_move)
    with pytest.raises(KeyboardInterrupt):
        _run(files, tmp_path, a, num_speakers=2)
    monkeypatch.setattr(os, "replace", real_replace)
    status, _, seen = _run(files, tmp_path, a, num_speakers=2)  # the old output, still normlab's: replaced
    assert seen == ["a.wav"] and set(status.values()) == {"ok"}


def test_paths_held_in_an_array_are_paths(files, tmp_path):
    """A numpy array (or pandas Series) of file names was accepted before the check for waveforms given as paths."""
    names = np.array([str(files / "wav" / "a.wav")])
    status, _, seen = _run(files, tmp_path, names)
    assert seen == ["a.wav"] and set(status.values()) == {"ok"}
