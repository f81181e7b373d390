"""normlab.diarization.diarize: inputs of every accepted kind, API and CLI settings, bad input, bounded memory.

A debug-sized EEND model and a speaker encoder with random weights keep this fast and independent of the
installed speaker-encoder weights; quality is tested in test_diarize_quality.py."""
import json
import os

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab import UserError
from normlab.cli import main
from normlab.diarization import (
    Diarization,
    EENDModel,
    ModelConfig,
    Turn,
    diarize,
    diarize_files,
    from_annotation,
    read_rttm,
    to_annotation,
    write_rttm,
)
from normlab.diarization.io.features import FeatureConfig
from normlab.diarization.models.embed import MissingWeightsError, SpeakerEncoder, weights_path
from normlab.diarization.pipeline.config import PipelineConfig
from tiny_diarizer import SR, tiny_models, tones


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    # says "speech" often, so that there is something to cluster; tones, not speech: the model's own local
    # speakers, without the speech-activity gate
    tiny_models(d, 2.0, threshold=0.55, median=5, window=4.0, step=2.0, cluster_threshold=0.3, speakers="eend",
                vad="off")
    audio = tones(12)
    sf.write(d / "talk.wav", audio, SR)
    return d, audio


def _turns(d, audio, **kw):
    return diarize(audio, model=d / "m.pt", embedding=d / "enc.pt", **kw)


def test_an_output_the_system_refuses_is_said_by_its_own_name(files, tmp_path, monkeypatch):
    """An output that could not be moved into place (an immutable file) read "[Errno 1] Operation not permitted:
    'out/.talk.rttm.13428.tmp' -> 'out/talk.rttm'", naming the temporary; a full disk named no file."""
    import errno
    import os

    d, _ = files
    real = os.replace

    def refused(src, dst):
        if str(dst).endswith(".rttm"):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))  # as the system
        return real(src, dst)

    monkeypatch.setattr(os, "replace", refused)
    status = diarize_files([d / "talk.wav"], tmp_path / "out", model=d / "m.pt", embedding=d / "enc.pt")
    assert status == {str(d / "talk.wav"): f"{tmp_path / 'out' / 'talk.rttm'}: Operation not permitted"}
    assert not [f for f in (tmp_path / "out").iterdir() if f.name.endswith(".tmp")]  # no temporary left


def test_inputs_of_every_kind_agree(files):
    d, audio = files
    from_path = diarize(d / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt")
    assert from_path and {t.uri for t in from_path} == {"talk"}
    shifted = lambda ts: [(t.start, t.duration, t.speaker) for t in ts]  # noqa: E731
    for a in (audio, audio[None], torch.from_numpy(audio)[None], {"waveform": torch.from_numpy(audio)[None],
                                                                    "sample_rate": SR}):
        got = _turns(d, a, **({} if isinstance(a, dict) else {"sample_rate": SR}))
        assert shifted(got) == shifted(from_path)
    stereo = np.stack([audio, audio])  # two identical channels: the same recording
    assert shifted(_turns(d, stereo, sample_rate=SR)) == shifted(from_path)


def test_any_path_like_names_a_file(files, tmp_path):
    """An ``os.PathLike`` other than ``pathlib.Path`` (an ``os.scandir`` entry) was "not a path", and failed the
    whole ``diarize_files`` call."""
    d, _ = files
    entry = next(e for e in os.scandir(d) if e.name == "talk.wav")
    want = [(t.start, t.duration, t.speaker) for t in diarize(d / "talk.wav", model=d / "m.pt", embedding=d / "enc.pt")]
    assert [(t.start, t.duration, t.speaker) for t in diarize(entry, model=d / "m.pt", embedding=d / "enc.pt")] == want
    status = diarize_files([entry], tmp_path / "out", model=d / "m.pt", embedding=d / "enc.pt")
    assert status == {os.fspath(entry): "ok"} and (tmp_path / "out" / "talk.rttm").is_file()


def test_a_link_that_loops_is_one_bad_file_and_the_others_are_written(files, tmp_path):
    """A stale link that loops among the inputs (``diarize evaluate`` reads a whole folder) stopped the call with
    pathlib's "Symlink loop" as a bug in normlab, and no file was diarized."""
    d, _ = files
    (tmp_path / "loop.wav").symlink_to("loop.wav")
    status = diarize_files([tmp_path / "loop.wav", d / "talk.wav"], tmp_path / "out", model=d / "m.pt",
                           embedding=d / "enc.pt")
    assert status[str(d / "talk.wav")] == "ok" and (tmp_path / "out" / "talk.rttm").is_file(), status
    assert status[str(tmp_path / "loop.wav")] != "ok", status


def test_model_file_sets_the_post_processing(files):
    d, _ = files
    cfg = PipelineConfig.for_model(EENDModel.load(d / "m.pt"))
    assert (cfg.threshold, cfg.median, cfg.window, cfg.step, cfg.cluster_threshold) == (0.55, 5, 4.0, 2.0, 0.3)
    assert PipelineConfig.for_model(EENDModel.load(d / "m.pt"), threshold=0.7).threshold == 0.7
    with pytest.raises(ValueError, match="step"):
        PipelineConfig.for_model(EENDModel.load(d / "m.pt"), step=9.0)


def test_each_mode_reads_its_own_settings(files):
    """eend: the model file's post-processing beats the mode's defaults; speech: the mode's beat the file's
    (they were chosen for another reading of the model); an explicit option beats both."""
    from normlab.diarization.pipeline.config import MODE_DEFAULTS

    d, _ = files
    m = EENDModel.load(d / "m.pt")  # its file: speakers eend, threshold 0.55, median 5, cluster_threshold 0.3
    eend = PipelineConfig.for_model(m)
    assert (eend.threshold, eend.cluster_threshold, eend.piece) == (0.55, 0.3, MODE_DEFAULTS["ge2e"]["eend"]["piece"])
    speech = PipelineConfig.for_model(m, speakers="speech")
    mode = MODE_DEFAULTS["ge2e"]["speech"]
    assert (speech.threshold, speech.cluster_threshold, speech.piece) == (mode["threshold"], mode["cluster_threshold"],
                                                                          mode["piece"])
    assert speech.median == 5  # what the mode does not set still comes from the file
    assert PipelineConfig.for_model(m, speakers="speech", threshold=0.7).threshold == 0.7
    # Silero alone deciding speech is a speech-mode reading: asked for alone it brings that mode, with eend it is
    # one clear error (it used to act as the gate, silently)
    assert PipelineConfig.for_model(m, vad="speech").speakers == "speech"
    # with the settings chosen for Silero alone stored, vad="speech" reads at them (the docs' comparison), the
    # speech mode with the model deciding speech keeps its own, and an explicit option still wins
    m.postprocess = {**m.postprocess, "vad_speech": {"speakers": "speech", "vad": "speech", "threshold": 0.2,
                                                 "cluster_threshold": 0.45, "min_cluster": 2.0}}
    vad = PipelineConfig.for_model(m, vad="speech")
    assert (vad.vad, vad.threshold, vad.cluster_threshold, vad.min_cluster) == ("speech", 0.2, 0.45, 2.0)
    assert PipelineConfig.for_model(m, speakers="speech").threshold == mode["threshold"]
    assert PipelineConfig.for_model(m, vad="speech", threshold=0.3).threshold == 0.3
    with pytest.raises(UserError, match="use vad 'gate'"):
        PipelineConfig.for_model(m, vad="speech", speakers="eend")


def test_a_file_without_chosen_settings_cuts_at_the_defaults_of_the_encoder_that_embeds(files):
    """A cut is a distance in one encoder's space: CAM++ on a file that holds no settings chosen for it gets
    CAM++'s defaults, not GE2E's (at GE2E's cut CAM++ split the dev conversations into too many speakers)."""
    from normlab.diarization.pipeline.config import MODE_DEFAULTS

    d, _ = files
    m = EENDModel.load(d / "m.pt")
    m.postprocess = {k: v for k, v in m.postprocess.items() if k != "cluster_threshold"}  # the file chose no cut
    for mode in ("eend", "speech"):
        for enc in ("ge2e", "campplus"):
            cfg = PipelineConfig.for_model(m, speakers=mode, speaker_encoder=enc)
            want = MODE_DEFAULTS[enc][mode]
            assert (cfg.cluster_threshold, cfg.piece, cfg.min_cluster) == (
                want["cluster_threshold"], want["piece"], want["min_cluster"]), (mode, enc)
        assert MODE_DEFAULTS["campplus"][mode]["cluster_threshold"] > MODE_DEFAULTS["ge2e"][mode]["cluster_threshold"]
    # the file's encoder, when it names one, picks the defaults too; the caller's cut still wins
    m.postprocess = {**m.postprocess, "speaker_encoder": "campplus"}
    assert PipelineConfig.for_model(m).cluster_threshold == MODE_DEFAULTS["campplus"]["eend"]["cluster_threshold"]
    assert PipelineConfig.for_model(m, cluster_threshold=0.4).cluster_threshold == 0.4


class _Built(UserError):
    """Stops a run as soon as its pipeline settings are made (a ``UserError``: with ``NORMLAB_DEBUG`` set the CLI
    passes it on instead of printing it)."""


def test_cli_and_api_build_the_same_pipeline_config(files, tmp_path, monkeypatch):
    """``PipelineConfig.for_model`` is the one builder of the settings: the API, ``diarize_files``, the CLI's run and
    evaluate all call it, and with the same options (and with none: each CLI default must mean "the model file's",
    which this model file sets to something else than every pipeline default) they get the same settings."""
    d, _ = files
    stored = EENDModel.load(d / "m.pt").postprocess
    assert all(stored[k] != getattr(PipelineConfig, k) for k in ("threshold", "median", "speakers", "vad", "flat_db"))
    real = PipelineConfig.for_model.__func__
    built = []

    def spy(cls, model, **options):
        built.append(real(cls, model, **options))
        raise _Built

    monkeypatch.setattr(PipelineConfig, "for_model", classmethod(spy))
    monkeypatch.setenv("NORMLAB_DEBUG", "1")
    wav, m, enc, ref = d / "talk.wav", d / "m.pt", d / "enc.pt", tmp_path / "ref.rttm"
    ref.write_text("SPEAKER talk 1 0.000 1.000 <NA> <NA> A <NA> <NA>\n")
    cli_options = {(): {}, ("--threshold", "0.7", "--median", "3", "--local-speakers", "speech", "--vad", "gate",
                            "--flat-db", "1.5", "--offset-threshold", "0.3"):
                   {"threshold": 0.7, "median": 3, "speakers": "speech", "vad": "gate", "flat_db": 1.5,
                    "offset_threshold": 0.3}}
    for argv, options in cli_options.items():
        built.clear()
        for run in (lambda argv=argv: main(["diarize", str(wav), "--model", str(m), "--embedding", str(enc),
                                            "--out", str(tmp_path / "cli"), *argv]),
                    lambda argv=argv: main(["diarize", "evaluate", str(d), str(ref), "--model", str(m),
                                            "--embedding", str(enc), "--out", str(tmp_path / "ev"), *argv]),
                    lambda options=options: diarize(wav, model=m, embedding=enc, **options),
                    lambda options=options: diarize_files([wav], tmp_path / "api", model=m, embedding=enc, **options)):
            with pytest.raises(_Built):
                run()
        assert len(built) == 4 and built[1:] == built[:-1], (argv, built)
    assert built[0].speakers == "speech" and built[0].threshold == 0.7 and built[0].flat_db == 1.5
    assert built[0].offset_threshold == 0.3


def test_evaluate_prints_what_score_prints(files, tmp_path, capsys):
    d, _ = files
    # evaluate prints the same numbers as score on the written RTTMs
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 12, 2)], ref)
    capsys.readouterr()
    rc = main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
               "--max-speakers", "3", "--out", str(tmp_path / "ev"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and [f["uri"] for f in result["files"]] == ["talk"]
    for collar in ("0", "0.25"):
        main(["diarize", "score", str(ref), str(tmp_path / "ev"), "--collar", collar])
        line = capsys.readouterr().out.splitlines()[0]
        assert line == f"DER: {100 * result['total'][collar]['der']:.2f}%"
        assert result["files"][0]["collars"][collar]["der"] == result["total"][collar]["der"]


def test_evaluate_lists_a_recording_the_reference_does_not_name_and_scores_what_score_scores(files, tmp_path,
                                                                                                capsys):
    """A second recording without reference turns: diarized and written, not scored (`diarize score` skips it
    with a warning). It was scored as an empty reference: its speech all false alarm (a total of hundreds of %)."""
    d, audio = files
    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "talk.wav", audio, SR)
    sf.write(folder / "stray.wav", audio, SR)
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 12, 2)], ref)
    args = [str(folder), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"), "--num-speakers",
            "2", "--out", str(tmp_path / "ev")]
    capsys.readouterr()
    assert main(["diarize", "evaluate", *args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (tmp_path / "ev" / "stray.rttm").is_file() and result["unscored"] == ["stray"]
    assert [f["uri"] for f in result["files"]] == ["talk"] and result["count_right"] == 1
    # what made the numbers: versions, settings and the model files (it recorded none)
    from normlab.diarization.models.weights import sha256

    assert result["provenance"]["normlab"] and result["settings"]["num_speakers"] == 2
    assert result["provenance"]["pipeline"]["model"]["sha256"] == sha256(d / "m.pt")
    for collar in ("0", "0.25"):
        main(["diarize", "score", str(ref), str(tmp_path / "ev"), "--collar", collar])
        assert capsys.readouterr().out.splitlines()[0] == f"DER: {100 * result['total'][collar]['der']:.2f}%"
    main(["diarize", "evaluate", *args, "--overwrite"])
    text = capsys.readouterr().out.splitlines()
    assert text[-1] == "not in the reference, not scored: 1 recordings (stray)", text


def test_evaluate_counts_each_files_speakers_in_the_reference_and_the_written_turns(files, tmp_path, capsys):
    d, _ = files
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 3}") for s in range(0, 12, 2)], ref)  # 3 speakers
    for n, want in ((3, 1), (1, 0)):  # the hypothesis's count fixed: right, then wrong
        out = tmp_path / f"ev{n}"
        main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
              "--num-speakers", str(n), "--out", str(out), "--json"])
        result = json.loads(capsys.readouterr().out)
        written = {t.speaker for t in read_rttm(out / "talk.rttm")["talk"]}
        assert result["files"][0]["speakers"] == {"reference": 3, "hypothesis": len(written)}
        assert len(written) == n and result["count_right"] == want
        main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
              "--num-speakers", str(n), "--out", str(out)])
        text = capsys.readouterr().out.splitlines()
        assert text[1].endswith(f"  3/{n}") and text[-1] == f"speaker count right on {want} of 1 recordings"


def test_evaluate_names_a_failed_file_once_and_says_what_its_failure_scored(files, tmp_path, capsys):
    """A file that cannot be read: its path once, its error, and whether it was scored (as all missed: in the
    reference) or not (not in the reference)."""
    d, audio = files
    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "talk.wav", audio, SR)
    (folder / "broken.wav").write_bytes(b"RIFF")
    (folder / "stray.wav").write_bytes(b"RIFF")
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn(u, 0.0, 2.0, "v0") for u in ("talk", "broken")], ref)
    capsys.readouterr()
    rc = main(["diarize", "evaluate", str(folder), str(ref), "--model", str(d / "m.pt"), "--embedding",
               str(d / "enc.pt"), "--out", str(tmp_path / "ev")])
    captured = capsys.readouterr()
    assert not [line for line in captured.out.splitlines() if "error" in line], captured.out  # errors: stderr
    out = captured.err.splitlines()
    broken = [line for line in out if line.startswith(str(folder / "broken.wav"))]
    stray = [line for line in out if line.startswith(str(folder / "stray.wav"))]
    assert rc == 1 and len(broken) == len(stray) == 1, out
    assert broken[0].count("broken.wav") == 1 and broken[0].endswith("(scored as all missed)"), broken
    assert stray[0].count("stray.wav") == 1 and stray[0].endswith("(not in the reference)"), stray


def test_short_silent_and_resampled_audio(files):
    d, audio = files
    short = _turns(d, audio[: 3 * SR], sample_rate=SR)  # shorter than one window
    assert all(t.end <= 3.0 + 1e-6 for t in short)
    assert _turns(d, np.zeros(20 * SR, dtype=np.float32), sample_rate=SR) == []  # all silence: no speakers
    assert _turns(d, np.zeros(100, dtype=np.float32), sample_rate=SR) == []  # shorter than one frame
    tel = _turns(d, audio[::2], sample_rate=8000)  # 8 kHz telephone rate
    assert tel and max(t.end for t in tel) <= 12.0 + 1e-6
    up = np.repeat(audio, 3)  # 48 kHz stereo
    hi = _turns(d, np.stack([up, up]), sample_rate=48000)
    assert hi and max(t.end for t in hi) <= 12.0 + 1e-6


def test_bad_input_is_one_clear_error(files, tmp_path, capsys):
    d, audio = files
    bad = [
        (dict(audio=audio), "sample_rate is required"),
        (dict(audio=audio, sample_rate=SR, num_speakers=0), "num_speakers must be a positive integer"),
        (dict(audio=audio, sample_rate=SR, min_speakers=3, max_speakers=2), "greater than max_speakers"),
        (dict(audio=audio[:, None].repeat(2, 1), sample_rate=SR), "looks like .samples, channels."),
        (dict(audio=np.full(100, np.nan, dtype=np.float32), sample_rate=SR), "NaN"),
        (dict(audio={"waveform": audio}), "'waveform' and 'sample_rate'"),
        (dict(audio=str(tmp_path / "missing.wav")), "missing.wav"),
    ]
    for kw, message in bad:
        with pytest.raises((ValueError, TypeError, OSError), match=message):
            diarize(**kw, model=d / "m.pt", embedding=d / "enc.pt")
    with pytest.raises(TypeError, match="audio must be"):
        diarize([1.0, 2.0], sample_rate=SR, model=d / "m.pt", embedding=d / "enc.pt")
    # the model and the encoder weights: errors that name the file
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        diarize(audio, sample_rate=SR, model=tmp_path / "nope.pt", embedding=d / "enc.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.pt is not a normlab EEND model"):
        diarize(audio, sample_rate=SR, model=tmp_path / "junk.pt", embedding=d / "enc.pt")
    EENDModel(ModelConfig(input_dim=40, d_model=16, n_heads=2, n_layers=1, d_ff=32)).save(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt expects 40-dim features"):
        diarize(audio, sample_rate=SR, model=tmp_path / "other.pt", embedding=d / "enc.pt")
    # a model trained on another feature setup of the same size (23 bands, 15 frames, but 16 kHz and every 5th
    # frame kept): refused at load, naming both setups
    odd = EENDModel(ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32))
    odd.features = FeatureConfig(sample_rate=16000, win=400, hop=160, n_fft=512, subsample=5)
    odd.save(tmp_path / "odd.pt")
    assert EENDModel.load(tmp_path / "odd.pt").features == odd.features  # the file keeps its setup
    with pytest.raises(ValueError, match=r"^\S*odd.pt was trained on features with sample_rate=16000, win=400, "
                       r"hop=160, "
                       r"n_fft=512, subsample=5; this pipeline makes sample_rate=8000, win=200, hop=80, n_fft=256, "
                       r"subsample=10$"):
        diarize(audio, sample_rate=SR, model=tmp_path / "odd.pt", embedding=d / "enc.pt")
    odd.features = FeatureConfig(hop="80")  # a value of another type: both named so that they differ
    odd.save(tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"with hop='80'; this pipeline makes hop=80$"):
        diarize(audio, sample_rate=SR, model=tmp_path / "odd.pt", embedding=d / "enc.pt")
    with pytest.raises(ValueError, match="junk.pt is not a GE2E speaker encoder"):
        diarize(audio, sample_rate=SR, model=d / "m.pt", embedding=tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="m.pt is not a GE2E speaker encoder checkpoint: it is an EEND segmentation "
                       "model .give it with --model."):
        diarize(audio, sample_rate=SR, model=d / "m.pt", embedding=d / "m.pt")
    # the CLI: one line on stderr, non-zero exit
    for argv in (["--num-speakers", "0"], ["--min-speakers", "3", "--max-speakers", "2"],
                 ["--model", str(tmp_path / "nope.pt")], ["--model", str(tmp_path / "odd.pt")]):
        capsys.readouterr()
        rc = main(["diarize", str(d / "talk.wav"), "--embedding", str(d / "enc.pt"), "--out", str(tmp_path), *argv])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and len(err.splitlines()) == 1 and "error" in err, (argv, err)


def test_missing_encoder_weights_name_the_file_and_the_fix(monkeypatch, tmp_path):
    """The weights ship in the package: a damaged install is told which file is missing and how to reinstall."""
    from normlab.diarization.models import weights

    monkeypatch.setattr(weights, "ASSETS", tmp_path)
    with pytest.raises(MissingWeightsError, match=r"ge2e.safetensors is missing .*pip install --force-reinstall"):
        weights_path()
    with pytest.raises(MissingWeightsError):
        SpeakerEncoder.load()


def test_long_recordings_are_processed_in_blocks():
    """Block-wise mel frames equal the one-shot ones: memory is bounded by the block, not the file (features: in
    test_eend_features.py)."""
    torch.manual_seed(0)
    enc = SpeakerEncoder()
    w16 = torch.randn(SR * 7 + 5) * 0.1
    assert torch.allclose(enc.features(w16, block=150), enc.mel(w16), rtol=1e-4, atol=1e-6)


def test_annotation_round_trip():
    pytest.importorskip("pyannote.core")
    turns = [Turn("rec", 0.5, 2.0, "spk0"), Turn("rec", 1.5, 1.0, "spk1")]
    ann = to_annotation(turns)
    assert ann.uri == "rec" and sorted(ann.labels()) == ["spk0", "spk1"]
    back = from_annotation(ann)
    assert [(t.uri, t.speaker, round(t.start, 6), round(t.duration, 6)) for t in back] == \
        [(t.uri, t.speaker, t.start, t.duration) for t in turns]


def test_none_for_an_annotation_or_numpy_numbers_in_a_diarization_are_said_or_kept():
    """to_annotation(None) raised "'NoneType' object is not iterable", from_annotation(None) an AttributeError;
    a Diarization given np.float32 seconds or numpy numbers in its provenance failed only at to_json()."""
    from normlab._checks import BadType

    pytest.importorskip("pyannote.core")
    with pytest.raises(BadType, match="to_annotation takes one recording's list of turns, got NoneType"):
        to_annotation(None)
    with pytest.raises(BadType, match="from_annotation takes a pyannote.core.Annotation, got NoneType"):
        from_annotation(None)
    d = Diarization([Turn("rec", 0.0, 1.0, "A")], duration=np.float32(2.5), provenance={"n": np.int64(3)})
    assert json.loads(d.to_json())["duration"] == 2.5 and type(d.provenance["n"]) is int


def test_annotations_keep_the_recording_and_write_as_rttm():
    """A silent recording's annotation lost its name; turns of two recordings merged into one annotation; a
    label with a tab or a recording named with a space gave turns that to_rttm() refused."""
    pytest.importorskip("pyannote.core")
    from pyannote.core import Annotation, Segment

    assert to_annotation(Diarization([], uri="quiet")).uri == "quiet"
    gen = (t for t in [Turn("g", 0.0, 1.0, "s"), Turn("g", 2.0, 1.0, "t")])  # read once: still both turns
    assert len(to_annotation(gen)) == 2
    with pytest.raises(ValueError, match="has turns of 2 recordings"):
        to_annotation([Turn("a", 0.0, 1.0, "s"), Turn("b", 0.0, 1.0, "s")])
    ann = Annotation(uri="my meeting")
    ann[Segment(0.0, 1.0)] = "Ann\tLee"
    back = Diarization(from_annotation(ann))
    assert [(t.uri, t.speaker) for t in back] == [("my_meeting", "Ann_Lee")] and back.to_rttm()
    ann[Segment(2.0, 3.0)] = ""
    with pytest.raises(ValueError, match="speaker label '' at 2.000 s"):
        from_annotation(ann)


def test_a_dicts_uri_is_checked_and_half_precision_tensors_are_read(files):
    """``{"uri": ""}`` was accepted and its turns could not be written, ``"uri": None`` became 'None'; a
    bfloat16 tensor raised numpy's TypeError."""
    d, audio = files
    wave = torch.from_numpy(audio)[None]
    with pytest.raises(ValueError, match="'uri' must be a non-empty string, got ''"):
        _turns(d, {"waveform": wave, "sample_rate": SR, "uri": ""})
    assert _turns(d, {"waveform": wave, "sample_rate": SR, "uri": None}).uri == "audio"
    ref = _turns(d, {"waveform": wave.to(torch.bfloat16).float(), "sample_rate": SR})
    assert _turns(d, {"waveform": wave.to(torch.bfloat16), "sample_rate": SR}) == ref


def test_no_turn_ends_after_the_audio(files):
    """The last 100 ms frame may reach past the end: a 10.05 s file had a turn ending at 10.1 s."""
    d, audio = files
    cut = audio[: int(11.95 * SR)]  # speech to the end, 11.95 s: not a whole number of frames
    turns = _turns(d, cut, sample_rate=SR)
    assert turns and max(t.end for t in turns) <= turns.duration == 11.95
    from normlab.diarization.pipeline.stitch import ending_at

    # the duration rounded to the millisecond ended past the audio: 0.2 + 0.007 = 0.20700000000000002 > 0.207
    rng = np.random.default_rng(0)
    for start, end in [(0.2, 0.207)] + [tuple(sorted(np.round(rng.uniform(0, 100, 2), 3))) for _ in range(500)]:
        assert ending_at(Turn("x", float(start), 200.0, "s"), float(end)).end <= end


def test_speech_mode_has_one_speaker_at_a_time(files):
    """speakers="speech": the model says where speech is, the embeddings of 1.5 s pieces say who; never overlap."""
    d, audio = files
    turns = sorted(_turns(d, audio, sample_rate=SR, speakers="speech", piece=1.5), key=lambda t: t.start)
    assert turns
    assert all(a.end <= b.start + 1e-6 for a, b in zip(turns, turns[1:]))
    with pytest.raises(ValueError, match="unknown speakers mode"):
        _turns(d, audio, sample_rate=SR, speakers="both")


def test_an_unknown_speaker_encoder_is_named_as_one():
    """It said the model file had no settings chosen with encoder 'bogus' and to tune some."""
    with pytest.raises(ValueError, match="^unknown speaker encoder 'bogus'; valid: ge2e, campplus$"):
        diarize(np.zeros(SR, np.float32), sample_rate=SR, speaker_encoder="bogus")


def test_an_unknown_option_names_the_keyword_meant():
    """The command line's ``--local-speakers`` is the keyword ``speakers``: ``local_speakers=`` was refused as a
    Python list, with no hint."""
    silence = np.zeros(SR, np.float32)
    with pytest.raises(ValueError, match=r"^unknown pipeline option 'local_speakers' \(did you mean 'speakers'\?\)$"):
        diarize(silence, sample_rate=SR, local_speakers="eend")
    with pytest.raises(ValueError, match=r"^unknown pipeline options 'bogus', 'thresold' \(did you mean "
                                         r"'threshold'\?\)$"):
        diarize(silence, sample_rate=SR, thresold=0.5, bogus=1)


def _evaluate_refused(tmp_path, capsys, monkeypatch, reference: str) -> list[str]:
    """``diarize evaluate`` of a folder holding talk.wav against ``reference`` (RTTM text), which must stop before
    any work with exit status 2: the lines it said."""
    from normlab.cli import main
    from normlab.diarization.pipeline import api

    (tmp_path / "wavs").mkdir()
    (tmp_path / "wavs" / "talk.wav").write_bytes(b"")
    (tmp_path / "ref.rttm").write_text(reference)
    monkeypatch.setattr(api, "diarize_files", lambda *a, **k: pytest.fail("diarized before checking"))
    assert main(["diarize", "evaluate", str(tmp_path / "wavs"), str(tmp_path / "ref.rttm")]) == 2
    return capsys.readouterr().err.strip().splitlines()


def test_evaluate_refuses_a_reference_that_names_none_of_the_audio(tmp_path, capsys, monkeypatch):
    """A reference for other recordings printed an all-inf% table after diarizing everything: now one line
    naming both, before any work."""
    err = _evaluate_refused(tmp_path, capsys, monkeypatch, "SPEAKER other 1 0.000 1.000 <NA> <NA> A <NA> <NA>\n")
    assert len(err) == 1 and "none of the 1 audio files" in err[0] and "other" in err[0]


def test_evaluate_says_a_reference_without_turns_has_none(tmp_path, capsys, monkeypatch):
    """An empty (or comments-only) reference read "none of the 1 audio files ... (its recordings: none)"."""
    err = _evaluate_refused(tmp_path, capsys, monkeypatch, ";; nothing here\n\n")
    assert len(err) == 1 and err[0].endswith("ref.rttm has no speaker turns (no SPEAKER line)"), err


def test_evaluate_refuses_a_uem_without_reference_speech_before_any_work(tmp_path, capsys, monkeypatch):
    """A UEM past the end of the speech printed DER 0.00% and exited 0, where `diarize score` refuses."""
    from normlab.cli import main
    from normlab.diarization.pipeline import api

    (tmp_path / "wavs").mkdir()
    (tmp_path / "wavs" / "talk.wav").write_bytes(b"")
    (tmp_path / "ref.rttm").write_text("SPEAKER talk 1 0.000 5.000 <NA> <NA> A <NA> <NA>\n")
    (tmp_path / "all.uem").write_text("talk 1 100.000 200.000\n")
    monkeypatch.setattr(api, "diarize_files", lambda *a, **k: pytest.fail("diarized before checking"))
    assert main(["diarize", "evaluate", str(tmp_path / "wavs"), str(tmp_path / "ref.rttm"), "--uem",
                 str(tmp_path / "all.uem")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to score: the reference has no speech inside the UEM" in err[0]


def test_evaluate_names_the_reference_recordings_it_has_no_audio_for(files, tmp_path, capsys):
    """They were left out without a word: the total read lower than `diarize score` on the same folder."""
    d, _ = files
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", 0.0, 4.0, "a"), Turn("absent", 0.0, 4.0, "b")], ref)
    capsys.readouterr()
    main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
          "--out", str(tmp_path / "ev")])
    out = capsys.readouterr().out
    assert "in the reference without an audio file in the folder, not scored: 1 recordings (absent)" in out
    main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
          "--out", str(tmp_path / "ev2"), "--json"])
    assert json.loads(capsys.readouterr().out)["no_audio"] == ["absent"]


def test_evaluate_names_the_recordings_its_uem_leaves_out(files, tmp_path, capsys):
    """A recording with audio and reference but no region in the UEM read n/a without a word (`diarize score`
    warns of it)."""
    import shutil

    d, _ = files
    wavs = tmp_path / "wavs"
    wavs.mkdir()
    for name in ("talk", "other"):
        shutil.copy(d / "talk.wav", wavs / f"{name}.wav")
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", 0.0, 4.0, "a"), Turn("other", 0.0, 4.0, "b")], ref)
    (tmp_path / "all.uem").write_text("talk 1 0 4\nother 1 2 2\n")  # other: a region of 0 s
    capsys.readouterr()
    main(["diarize", "evaluate", str(wavs), str(ref), "--uem", str(tmp_path / "all.uem"), "--model",
          str(d / "m.pt"), "--embedding", str(d / "enc.pt"), "--out", str(tmp_path / "ev"), "--html",
          str(tmp_path / "page")])
    assert "without a region in the UEM, not scored: 1 recordings (other)" in capsys.readouterr().out
    assert "Without a region in the UEM, not scored: other." in (tmp_path / "page" / "index.html").read_text()


def test_a_recording_without_reference_speech_reads_n_a_not_0_percent():
    from normlab.diarization.metrics.evaluate import format_evaluation

    empty = {"der": None, "total": 0.0}
    result = {"total": {"0": {"der": 0.25, "total": 4.0}}, "count_right": 1, "unscored": [],
              "files": [{"uri": "quiet", "collars": {"0": empty}, "speakers": {"reference": 0, "hypothesis": 0}}]}
    assert format_evaluation(result).splitlines()[1].split()[:2] == ["quiet", "n/a"]


def test_the_silence_gate_follows_a_quiet_recording_of_speech_only():
    """-70 dBFS for a recording at a usual level; 45 dB below the loud frames of a quieter one that has speech's
    dynamics; -70 again for stationary noise alone (which the model takes for speech) and digital silence."""
    from normlab.diarization.pipeline.segment import silence_gate_db

    speech = torch.cat([torch.full((80,), -22.0), torch.full((20,), -60.0)])  # talk and pauses (dBFS per frame)
    assert silence_gate_db(speech, -70.0, 45.0) == -70.0  # loud frames at -22: 45 below is above -70
    quiet = speech - 30  # the same, 30 dB quieter
    assert silence_gate_db(quiet, -70.0, 45.0) == pytest.approx(-52.0 - 45.0)
    assert silence_gate_db(quiet, -70.0, None) == -70.0
    noise = -85.0 + torch.rand(100, generator=torch.Generator().manual_seed(0)) * 6  # 6 dB of spread
    assert silence_gate_db(noise, -70.0, 45.0) == -70.0
    assert silence_gate_db(torch.full((50,), -float("inf")), -70.0, 45.0) == -70.0
    with_zeros = torch.cat([quiet, torch.full((400,), -float("inf"))])  # digital silence is no level
    assert silence_gate_db(with_zeros, -70.0, 45.0) == pytest.approx(-97.0)


def test_quiet_noise_alone_stays_silence():
    """The shipped model takes stationary noise alone for speech (its features are the log-mel minus the
    recording's mean); below -70 dBFS the gate keeps such a recording empty, as it keeps digital silence."""
    try:
        weights_path()
    except MissingWeightsError as e:
        pytest.skip(str(e))
    noise = (np.random.default_rng(0).standard_normal(20 * SR) * 1e-4).astype(np.float32)  # -80 dBFS white
    assert list(diarize(noise, sample_rate=SR)) == []


def test_a_file_name_with_spaces_is_diarized_and_scored(files, tmp_path, capsys):
    d, audio = files
    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "my talk.wav", audio, SR)  # RTTM fields are separated by spaces: the recording is my_talk
    rc = main(["diarize", str(folder / "my talk.wav"), "--model", str(d / "m.pt"), "--embedding",
               str(d / "enc.pt"), "--out", str(tmp_path / "out")])
    written = tmp_path / "out" / "my_talk.rttm"
    assert rc == 0 and f"wrote {written}" in capsys.readouterr().out
    assert {line.split()[1] for line in written.read_text().splitlines()} == {"my_talk"}
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("my_talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 12, 2)], ref)
    rc = main(["diarize", "evaluate", str(folder), str(ref), "--model", str(d / "m.pt"), "--embedding",
               str(d / "enc.pt"), "--out", str(tmp_path / "ev"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and [f["uri"] for f in result["files"]] == ["my_talk"] and not result["errors"]
    assert result["total"]["0"]["total"] == pytest.approx(12.0)  # the reference was found and scored


def test_outputs_that_cannot_be_written_stop_before_any_work(tmp_path):
    """An --out that is a file, or a folder where an output would go: one line before the model runs (the first
    was a bare 'File exists', the second failed after the work)."""
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(UserError, match="notes.txt is a file, and the outputs go into a folder"):
        diarize_files([tmp_path / "talk.wav"], tmp_path / "notes.txt")
    (tmp_path / "out" / "talk.rttm").mkdir(parents=True)
    with pytest.raises(UserError, match="talk.rttm is a folder where an output would go"):
        diarize_files([tmp_path / "talk.wav"], tmp_path / "out", overwrite=True)


def test_a_speaker_with_only_zero_length_turns_is_no_speaker_in_the_counts(tmp_path, monkeypatch):
    """DER drops zero-length turns (no speech); the speaker counts counted their speaker: 2/1 and the count
    wrong where DER read 0%."""
    import pathlib

    from normlab.diarization.metrics.evaluate import evaluate_folder
    from normlab.diarization.pipeline import api

    (tmp_path / "in").mkdir()
    sf.write(tmp_path / "in" / "talk.wav", np.zeros(SR, np.float32), SR)
    write_rttm([Turn("talk", 0.0, 5.0, "A"), Turn("talk", 5.0, 0.0, "B")], tmp_path / "ref.rttm")

    def written(paths, out, **kwargs):
        pathlib.Path(out).mkdir(exist_ok=True)
        for p in paths:
            write_rttm([Turn(p.stem, 0.0, 5.0, "x"), Turn(p.stem, 2.0, 0.0, "y")], pathlib.Path(out) / f"{p.stem}.rttm")
        return {str(p): "ok" for p in paths}

    monkeypatch.setattr(api, "diarize_files", written)
    result = evaluate_folder(tmp_path / "in", tmp_path / "ref.rttm", tmp_path / "out")
    assert result["files"][0]["speakers"] == {"reference": 1, "hypothesis": 1} and result["count_right"] == 1
    assert result["total"]["0"]["der"] == 0.0


def _diarized_as_half_a_second(seen: list):
    """A stand-in for ``diarize_files``: each input heard as 0.5 s of one speaker (its RTTM written), ``seen``
    filled with the inputs."""
    import pathlib

    def written(paths, out, **kwargs):
        seen.extend(paths)
        pathlib.Path(out).mkdir(exist_ok=True)
        for p in paths:
            write_rttm([Turn(p.stem, 0.0, 0.5, "x")], pathlib.Path(out) / f"{p.stem}.rttm")
        return {str(p): "ok" for p in paths}

    return written


def test_evaluate_reads_the_folder_layout_simulate_writes(tmp_path, monkeypatch):
    """``DIR/wav/*.wav`` beside ``DIR/ref.rttm`` (what simulate writes and tune reads) was "DIR has no .wav or
    .flac files"."""

    from normlab.diarization.metrics.evaluate import evaluate_folder
    from normlab.diarization.pipeline import api

    (tmp_path / "set" / "wav").mkdir(parents=True)
    sf.write(tmp_path / "set" / "wav" / "talk.wav", np.zeros(SR, np.float32), SR)
    write_rttm([Turn("talk", 0.0, 0.5, "A")], tmp_path / "set" / "ref.rttm")
    seen = []
    monkeypatch.setattr(api, "diarize_files", _diarized_as_half_a_second(seen))
    result = evaluate_folder(tmp_path / "set", tmp_path / "set" / "ref.rttm", tmp_path / "out")
    assert [p.name for p in seen] == ["talk.wav"] and result["total"]["0"]["der"] == 0.0


def test_evaluate_passes_over_a_subfolder_named_like_audio(tmp_path, monkeypatch):
    """A folder ``takes.wav/`` beside the recordings was taken for one: "a folder, not an audio file", exit 1."""
    from normlab.diarization.metrics.evaluate import evaluate_folder
    from normlab.diarization.pipeline import api

    (tmp_path / "set" / "takes.wav").mkdir(parents=True)
    sf.write(tmp_path / "set" / "talk.wav", np.zeros(SR, np.float32), SR)
    write_rttm([Turn("talk", 0.0, 0.5, "A")], tmp_path / "ref.rttm")
    seen = []
    monkeypatch.setattr(api, "diarize_files", _diarized_as_half_a_second(seen))
    result = evaluate_folder(tmp_path / "set", tmp_path / "ref.rttm", tmp_path / "out")
    assert [p.name for p in seen] == ["talk.wav"] and result["total"]["0"]["der"] == 0.0


def test_the_evaluation_table_prints_whole_recording_names():
    """Names were cut to 24 characters: two recordings with a long common prefix printed as one name."""
    from normlab.diarization.metrics.evaluate import format_evaluation

    cell = {"0.25": {"der": 0.1}}
    names = ["dev_conv_s1-2_real_aug_0_00006", "dev_conv_s1-2_real_aug_0_00007"]
    result = {"total": cell, "count_right": 2, "unscored": [],
              "files": [{"uri": n, "collars": cell, "speakers": {"reference": 2, "hypothesis": 2}} for n in names]}
    rows = format_evaluation(result).splitlines()
    assert [r.split()[0] for r in rows[1:3]] == names
    assert len({r.index("%") for r in rows[1:4]}) == 1  # the columns line up, TOTAL too


def test_run_says_what_each_file_held_and_that_a_silent_one_has_no_speech(files, tmp_path, capsys):
    """`diarize run` printed "wrote X" for a silent file too, whose RTTM is empty: a user could not tell it from a
    file that was diarized."""
    d, audio = files
    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "talk.wav", audio, SR)
    sf.write(folder / "quiet.wav", np.zeros(5 * SR, np.float32), SR)
    capsys.readouterr()
    rc = main(["diarize", str(folder / "talk.wav"), str(folder / "quiet.wav"), "--model", str(d / "m.pt"),
               "--embedding", str(d / "enc.pt"), "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().out.splitlines()
    talk = read_rttm(tmp_path / "out" / "talk.rttm")["talk"]
    speakers, speech = len({t.speaker for t in talk}), Diarization(talk).speech_seconds
    assert rc == 0 and talk and (tmp_path / "out" / "quiet.rttm").read_text() == ""
    assert lines == [f"{folder / 'talk.wav'}: wrote {tmp_path / 'out' / 'talk.rttm'} ({speakers} speaker"
                     f"{'s' * (speakers != 1)}, {speech:.1f} s of speech in 12.0 s)",
                     f"{folder / 'quiet.wav'}: wrote {tmp_path / 'out' / 'quiet.rttm'} (no speech found)"], lines


def test_a_diarizations_speech_counts_overlapped_speech_once():
    """`diarize run` said "20.0 s of speech in 15.7 s" where two speakers overlapped: it added up the turns."""
    d = Diarization([Turn("m", 0.0, 10.0, "a"), Turn("m", 2.0, 3.0, "b"), Turn("m", 12.0, 1.5, "b")], duration=15.0)
    assert d.speech_seconds == pytest.approx(11.5) and d.speakers == ["a", "b"]
    assert Diarization([]).speech_seconds == 0.0


def test_evaluate_reads_every_kind_of_audio_file_diarize_reads(tmp_path, monkeypatch):
    """A folder's .ogg, .mp3 and .WAV files were skipped by evaluate (diarize reads them), then reported as
    "in the reference without an audio file in the folder"."""

    from normlab.diarization.metrics.evaluate import evaluate_folder
    from normlab.diarization.pipeline import api

    (tmp_path / "set").mkdir()
    for name in ("a.ogg", "b.mp3", "c.WAV", "d.flac", "notes.txt"):
        (tmp_path / "set" / name).write_bytes(b"")
    write_rttm([Turn(u, 0.0, 0.5, "A") for u in "abcd"], tmp_path / "ref.rttm")
    seen = []
    monkeypatch.setattr(api, "diarize_files", _diarized_as_half_a_second(seen))
    result = evaluate_folder(tmp_path / "set", tmp_path / "ref.rttm", tmp_path / "out")
    assert [p.name for p in seen] == ["a.ogg", "b.mp3", "c.WAV", "d.flac"] and not result["no_audio"]


def test_evaluate_says_where_the_reference_speaks_after_the_audio_ends(tmp_path, monkeypatch):
    """A reference turn at 100-105 s of a 4 s file was scored as missed without a word."""
    import pathlib

    from normlab.diarization.metrics.evaluate import evaluate_folder, format_evaluation
    from normlab.diarization.pipeline import api
    from normlab.diarization.pipeline.output import Diarization

    (tmp_path / "set").mkdir()
    for name in ("cut.wav", "whole.wav"):
        (tmp_path / "set" / name).write_bytes(b"")
    write_rttm([Turn("cut", 0.0, 2.0, "A"), Turn("cut", 100.0, 5.0, "A"), Turn("whole", 0.0, 4.5, "A")],
               tmp_path / "ref.rttm")

    def written(paths, out, on_result, **kwargs):
        pathlib.Path(out).mkdir(exist_ok=True)
        for p in paths:
            turns = [Turn(p.stem, 0.0, 2.0, "x")]
            write_rttm(turns, pathlib.Path(out) / f"{p.stem}.rttm")
            on_result(str(p), Diarization(turns, uri=p.stem, duration=4.0))
        return {str(p): "ok" for p in paths}

    monkeypatch.setattr(api, "diarize_files", written)
    result = evaluate_folder(tmp_path / "set", tmp_path / "ref.rttm", tmp_path / "out")
    assert result["past_end"] == {"cut": "105.0 s, audio 4.0 s"}  # whole: 0.5 s past, within rounding
    assert ("reference speech after the audio's end, scored as missed: 1 recordings (cut (reference to 105.0 s, "
            "audio 4.0 s))") in format_evaluation(result)


def test_evaluate_refuses_a_format_it_would_not_score(files, tmp_path):
    """evaluate_folder(format="json") wrote JSON files and then scored the RTTMs in --out: none (an error after
    all the work) or a stale earlier run's, silently."""
    from normlab.diarization.metrics.evaluate import evaluate_folder

    d, audio = files
    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "talk.wav", audio, SR)
    write_rttm([Turn("talk", 0.0, 2.0, "v0")], tmp_path / "ref.rttm")
    with pytest.raises(UserError, match="evaluate writes and scores RTTM files: format='json'"):
        evaluate_folder(folder, tmp_path / "ref.rttm", tmp_path / "out", format="json", model=d / "m.pt")
    assert not (tmp_path / "out").exists()


def test_evaluate_loads_the_model_and_the_encoder_once(files, tmp_path, monkeypatch, capsys):
    """evaluate diarized with the loaded model and encoder, then loaded both again to say what made the numbers
    (0.3-0.4 s with the shipped files); a folder where every file failed still says it."""
    from normlab.diarization.pipeline import api

    d, _ = files
    ref = tmp_path / "ref.rttm"
    write_rttm([Turn("talk", s, 2.0, f"v{int(s) // 2 % 2}") for s in range(0, 12, 2)], ref)
    loads = []
    real = api.load_encoder
    monkeypatch.setattr(api, "load_encoder", lambda *a, **k: loads.append(a) or real(*a, **k))
    rc = main(["diarize", "evaluate", str(d), str(ref), "--model", str(d / "m.pt"), "--embedding", str(d / "enc.pt"),
               "--out", str(tmp_path / "ev"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(loads) == 1 and result["provenance"]["pipeline"]["model"]["sha256"]
    assert result["settings"] == api.made_with(model=d / "m.pt", embedding=d / "enc.pt")["settings"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "talk.wav").write_bytes(b"RIFF")
    rc = main(["diarize", "evaluate", str(broken), str(ref), "--model", str(d / "m.pt"), "--embedding",
               str(d / "enc.pt"), "--out", str(tmp_path / "ev2"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 1 and result["provenance"]["pipeline"]["model"]["sha256"] and result["errors"]


def test_a_bug_inside_the_per_file_loop_is_raised_not_reported_as_the_files_error(files, tmp_path, monkeypatch):
    """Every ValueError was taken for the file's fault: a numpy shape error (a bug) became one line, with no
    traceback even under NORMLAB_DEBUG, and ``evaluate`` scored the file as all missed."""
    from normlab.diarization.io.audio import AudioError
    from normlab.diarization.pipeline import api

    d, _ = files

    def broken(*a, **k):
        raise ValueError("operands could not be broadcast together with shapes (3,) (4,)")

    monkeypatch.setattr(api, "_diarize", broken)
    with pytest.raises(ValueError, match="could not be broadcast"):
        diarize_files([d / "talk.wav"], tmp_path / "out", model=d / "m.pt", embedding=d / "enc.pt")

    def bad_audio(p, *a, **k):
        raise AudioError(f"{p}: not audio")

    monkeypatch.setattr(api, "_diarize", bad_audio)  # the file's own fault: said, and the call goes on
    status = diarize_files([d / "talk.wav"], tmp_path / "out", model=d / "m.pt", embedding=d / "enc.pt")
    assert status == {str(d / "talk.wav"): f"{d / 'talk.wav'}: not audio"}


def test_diarize_files_takes_paths_and_says_so_of_anything_else(tmp_path):
    """An array, a dict (read as its keys: "waveform: no such file") or a None among the paths: a builtin
    TypeError's traceback, or a wrong error, where ``diarize`` is what takes waveforms."""
    from normlab import UserError
    from normlab.diarization import diarize_files

    for paths in (np.zeros(16000), {"waveform": np.zeros(16000), "sample_rate": 16000}, b"x.wav", ["x.wav", None],
                  [b"x.wav"], [np.zeros(16000)]):
        with pytest.raises(UserError, match=r"diarize_files takes paths of audio files, got .*diarize\(\) takes a "
                                            r"waveform"):
            diarize_files(paths, tmp_path / "out")


def test_an_output_name_longer_than_a_file_name_may_be_is_refused_before_any_work(tmp_path, monkeypatch):
    """An audio file named with 251 bytes and ".wav" (a legal name) was diarized whole, then its output
    (".rttm": 256 bytes) failed with "File name too long" and the work was thrown away."""
    from normlab.diarization.pipeline import api

    audio = tmp_path / ("M" * 251 + ".wav")
    sf.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    monkeypatch.setattr(api, "_prepare", lambda *a, **k: pytest.fail("the model was loaded: work began"))
    with pytest.raises(ValueError, match=r"^M{40}\.\.\. would be 256 bytes, more than a file name may be \(255\): "
                                         r"rename the audio to a shorter name$"):
        api.diarize_files([audio], tmp_path / "out")
