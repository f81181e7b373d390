"""The command line: help and version without torch, user errors as one line (exit 2), bugs with their traceback."""
import pathlib
import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["report", "--help"], ["lesson", "--help"]])
def test_help_and_version_do_not_import_torch(argv):
    r = _run(f"import sys; from normlab.cli import main; code = main({argv!r}); "
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(code)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "NO-TORCH"
    assert "usage: normlab" in r.stdout or "normlab 0." in r.stdout


def test_version_names_normlab_torch_and_python():
    from normlab import __version__

    r = _run("from normlab.cli import main; import sys; sys.exit(main(['--version']))")
    assert r.returncode == 0 and r.stdout.startswith(f"normlab {__version__} (torch ") and "Python 3." in r.stdout


@pytest.mark.parametrize("argv, message", [
    (["lesson", "--d-model", "0"], "expected a whole number from 1 to 2**31 - 1"),
    (["lesson", "--tokens", "1"], "expected a whole number >= 2 (InstanceNorm normalizes over the frames)"),
    (["lesson", "--batch", "99999999999999999999999"], "expected a whole number from 1 to 2**31 - 1"),
    (["bench", "--out", ""], "expected a path, got an empty one"),
    (["bench", "--repeats", "99999999999999999999999"], "expected a whole number from 1 to 10000"),
    (["bench", "--shapes", "4000000000x4000000000"], "has more elements than a tensor can hold"),
    (["report", "--out", ""], "expected a path, got an empty one"),
    (["report", "--jobs", "100000"], "four per core of this machine"),
    (["diarize", "simulate", "--out", "s", "--jobs", "100000"], "four per core of this machine"),
    (["lesson", "--d-model", "3"], "argument --d-model: expected a whole number >= 4 (over fewer features a "
                                   "token's variance can vanish into eps), got '3'"),
    (["lesson", "--batch", "1", "--tokens", "2"], "batch x tokens must be >= 3"),
    (["diarize", "train", "--data", "d", "--out", "o", "--norm", "groupnorm"], "invalid choice: 'groupnorm'"),
    # a model the pipeline cannot read, whose loss tries 9! orders a step (GBs of memory)
    (["diarize", "train", "--data", "d", "--out", "o", "--n-speakers", "9"], "n_speakers is at most 8"),
    (["diarize", "train", "--data", "d", "--out", "o", "--tensorboard", ""], "expected a path, got an empty one"),
    (["diarize", "recipe", "--out", "o", "--n-speakers", "9"], "n_speakers is at most 8"),
    (["diarize", "train", "--data", "d", "--out", "o", "--placement", "middle"], "invalid choice: 'middle'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--encoder", "lstm"], "invalid choice: 'lstm'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--decay", "linear"], "invalid choice: 'linear'"),
    (["diarize", "score", "/nonexistent.rttm", "/nonexistent"], "/nonexistent.rttm: no such file"),
    (["diarize", "score", "/dev/null", "a.rttm"], "/dev/null: not a file (a device or a socket)"),
    (["diarize", "score", "a.rttm", "a.rttm", "--uem", ""], "expected a path, got an empty one"),
    # drawn one window at a time until the system killed the process, without a word
    (["diarize", "train", "--data", "d", "--out", "o", "--batch", "100000000", "--frames", "50"],
     "a batch of 100000000 windows of 50 frames needs at least"),
    (["diarize", "recipe", "--out", "o", "--batch", "1000000000"], "windows of 100 frames needs at least"),
    # built layer by layer while the memory climbed, without a word
    (["diarize", "train", "--data", "d", "--out", "o", "--d-model", "16", "--n-layers", "100000000"],
     "a model of 100,000,000 layers of width 16"),
    (["count", "--preset", "gpt"], "invalid choice: 'gpt'"),
    (["bench", "--shapes", "0x0"], "shape needs at least 1 row and 1 feature, got '0x0'"),
    (["bench", "--shapes", "8x0"], "shape needs at least 1 row and 1 feature, got '8x0'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--lr", "-1"], "expected a number in (0, 1000], got '-1'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--lr", "nan"], "expected a number in (0, 1000], got 'nan'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--lr", "1e308"], "expected a number in (0, 1000]"),
    (["diarize", "train", "--data", "d", "--out", "o", "--threads", "100000"], "four per core of this machine"),
    (["diarize", "run", "x.wav", "--median", "999999999"], "an odd whole number from 1 to 1001"),
    (["diarize", "run", "x.wav", "--fill-gap", "1e308"], "a number of seconds from 0 to 3600"),
    (["diarize", "run", "x.wav", "--flat-db", "inf"], "a number of dB from 0 to 100"),
    (["diarize", "run", "x.wav", "--offset-threshold", "1.5"], "a number from 0 to 1"),
    (["diarize", "run", "x.wav", "--out", ""], "expected a path, got an empty one"),
    (["diarize", "tune", "--dev", "", "--out", "t.json"], "an empty folder name"),
    (["diarize", "simulate", "--out", "s", "--seed", "-1"], "expected a whole number from 0 to 2**63 - 1"),
    (["lesson", "--seed", "99999999999999999999999"], "expected a whole number from 0 to 2**63 - 1"),
    (["bench", "--compile"], "--compile needs --model"),
    (["report", "--address", "1.2.3.4:99"], "--address joins a Ray cluster: it needs --executor ray"),
    (["study", "lesson_stats", "--address", ""], "--address joins a Ray cluster: it needs --executor ray"),  # ran
    (["diarize", "x.wav", "--bogus"], "normlab diarize run: error: unrecognized arguments: --bogus (see normlab "
                                      "diarize run --help)"),
    (["bench", "--model", "--dispatch"], "--model times the whole encoder"),
    (["bench", "--model", "--shapes", "8x8"], "--model times the whole encoder"),
    (["bench", "--model", "--device", "cuda"], "--model measures on the CPU: --device cuda"),
    (["bench", "--dispatch", "--device", "auto"], "--dispatch measures on the CPU: --device auto"),
    (["bench", "--dispatch", "--cold-start"], "--cold-start and --repeats are for the norms' table"),
    (["bench", "--dispatch", "--repeats", "3"], "--cold-start and --repeats are for the norms' table"),
    # typed at the default's value: the option was dropped without a word (the check compared with the defaults)
    (["bench", "--dispatch", "--repeats", "15"], "--cold-start and --repeats are for the norms' table"),
    (["bench", "--model", "--ops", "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"],
     "--model times the whole encoder"),
    (["bench", "--device", "cuda", "--repeats", "15"], "--device cuda times the GPU section's fixed grid"),
    # the GPU section times its fixed grid: the CPU table's options were dropped without a word
    (["bench", "--device", "cuda", "--ops", "rms_norm"], "--device cuda times the GPU section's fixed grid"),
    (["bench", "--device", "cuda", "--cold-start"], "--device cuda times the GPU section's fixed grid"),
    (["bench", "--device", "cuda:0", "--shapes", "8x8"], "--device cuda:0 times the GPU section's fixed grid"),
    (["bench", "--shapes", "100000000x100000000", "--ops", "rms_norm", "--dtypes", "float32"], "out of memory"),
    (["diarize", "simulate", "--out", "s", "--beta", "1e308"], "beta (the mean silence, s) must be"),
    # a conversation draws its turns and rooms its own way: these wrote the same audio and were recorded as applied
    (["diarize", "simulate", "--out", "s", "--style", "conversation", "--rt60", "0.2", "0.4"],
     "--rt60 shapes style 'mixture'"),
    (["diarize", "simulate", "--out", "s", "--style", "conversation", "--beta", "3", "--max-utterances", "4",
      "--beta-by-count"], "--beta, --max-utterances, --beta-by-count shape style 'mixture'"),
    # sounds alone: nobody speaks, so these wrote the same audio too, recorded as applied
    (["diarize", "simulate", "--out", "s", "--style", "nonspeech", "--beta", "9", "--n-speakers", "4",
      "--min-utterances", "1"], "--beta, --min-utterances, --n-speakers shape the speakers of the other styles"),
    (["diarize", "simulate", "--out", "s", "--style", "nonspeech", "--sources", "all"], "--sources shapes the "),
    # read as a range error ("1 <= MIN <= MAX <= 3600 ... got (5.0, 6.0)"): the style is what is wrong
    (["diarize", "simulate", "--out", "s", "--duration", "5", "6"], "duration (seconds of talk) is for style "
                                                                    "'conversation'; style 'mixture' draws"),
    (["diarize", "train", "--data", "d", "--out", "o", "--warmup", "-1"], "expected a whole number >= 0, got '-1'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--d-model", "18"], "a multiple of 4, the encoder's heads"),
    (["diarize", "tune", "--dev", "/nonexistent"], "/nonexistent: no such folder"),
    (["diarize", "tune", "--dev", "/etc/passwd"], "/etc/passwd: a file, not a folder"),  # not "no such folder"
    # two test sets of one name: the later replaced the earlier, never scored
    (["diarize", "tune", "--dev", "d", "--test", "a/x", "--test", "b/x"], "a second test set named 'x'; name each as"),
    (["diarize", "run", "a.wav", "--median", "4"], "expected an odd whole number from 1 to 1001, got '4'"),
    (["diarize", "tunee", "--dev", "d"], "invalid choice: 'tunee'"),  # a mistyped command, not an audio file
    (["diarize", "evalute", "wavs", "ref.rttm"], "invalid choice: 'evalute'"),
    # an option's value that is a sub-command's name: still the shorthand for `run` (it blamed `train`'s options)
    (["diarize", "--out", "train", "--median", "4", "a.wav"], "normlab diarize run: error: argument --median"),
    (["diarize", "--out", "score", "--median", "4", "a.wav"], "normlab diarize run: error: argument --median"),
])
def test_user_errors_are_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    from normlab.cli import main

    monkeypatch.chdir(tmp_path)  # their relative paths (d, o) must never reach the repository, even if one ran

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_tune_names_the_option_and_the_value_it_cannot_use(tmp_path, capsys):
    """`--test =` blamed --dev; `--grid threshold=abc` printed float()'s "could not convert string to float"."""
    from normlab.cli import main

    (tmp_path / "dev").mkdir()
    out = ["--out", str(tmp_path / "t.json")]
    for extra, says in ((["--test", "="], "--test: an empty folder name"),
                        (["--grid", "threshold=abc"], "grid 'threshold=abc': 'abc' is not a number"),
                        (["--grid", "vbx_dims=1.5"], "grid 'vbx_dims=1.5': '1.5' is not a whole number"),
                        # checked before the grid's first setting ran, not when it reached 0.4
                        (["--grid", "piece=1.5,0.4"], "no piece would be embedded")):
        assert main(["diarize", "tune", "--dev", str(tmp_path / "dev"), *out, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_the_recipe_checks_its_model_before_it_simulates(tmp_path, capsys):
    """A width its heads do not divide: one line before any simulation (it failed after minutes of it)."""
    from normlab.cli import main

    assert main(["diarize", "recipe", "--out", str(tmp_path / "r"), "--d-model", "15"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "d_model 15 is not divisible by n_heads" in err[0], err
    assert not (tmp_path / "r").exists()


def test_the_recipe_keeps_files_it_did_not_write_and_runs_one_at_a_time(tmp_path, capsys, monkeypatch):
    """A user's results.json and model.pt in --out were replaced without a word, and a second recipe started into
    the same folder trained beside the first (both sharing model.pt.tmp) instead of stopping."""
    from normlab.cli import main
    from normlab.diarization.models.eend import EENDModel, ModelConfig
    from normlab.diarization.training import provenance, recipe
    from normlab.locks import folder_lock

    out = tmp_path / "r"
    out.mkdir()
    (out / "results.json").write_text('{"mine": true}')
    monkeypatch.setattr(recipe, "_run", lambda *a, **k: pytest.fail("work began before the check"))
    assert main(["diarize", "recipe", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.json exists and normlab did not write it" in err[0], err
    assert (out / "results.json").read_text() == '{"mine": true}'
    (out / "results.json").unlink()
    EENDModel(ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32)).save(out / "model.pt")  # someone's model
    assert main(["diarize", "recipe", "--out", str(out)]) == 2
    assert "model.pt exists and normlab did not write it" in capsys.readouterr().err
    provenance.write(out / "model.pt", {"recipe": {"steps": 10}})  # a recipe's own model (an earlier run's)
    monkeypatch.setattr(recipe, "_run", lambda *a, **k: {"ran": True})
    assert recipe.run_recipe(out, recipe.RecipeConfig()) == {"ran": True}
    with folder_lock(out, "written by a recipe", "wait"):  # another recipe at work there
        assert main(["diarize", "recipe", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out} is being written by a recipe" in err[0], err


def test_bench_never_replaces_a_file_it_did_not_write_and_says_so_before_measuring(tmp_path, capsys):
    from normlab.cli import main

    (tmp_path / "bench.md").write_text("my notes\n")
    argv = ["bench", "--shapes", "8x8", "--ops", "layer_norm", "--dtypes", "float32", "--repeats", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and "bench.md exists and normlab did not write it" in err  # no table: nothing was measured
    assert (tmp_path / "bench.md").read_text() == "my notes\n"
    assert main([*argv, "--overwrite"]) == 0 and main(argv) == 0  # then its own output is replaced freely


def test_tune_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    """`diarize tune --out` over a user's file stops before any work (it used to replace it at the end)."""
    from normlab.cli import main

    (tmp_path / "dev").mkdir()
    notes = tmp_path / "notes.json"
    notes.write_text("my notes\n")
    assert main(["diarize", "tune", "--dev", str(tmp_path / "dev"), "--out", str(notes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.json exists and normlab did not write it" in err[0], err
    assert notes.read_text() == "my notes\n"


def test_a_missing_audio_file_is_still_read_as_audio_not_a_command(capsys):
    from normlab.cli import main

    assert main(["diarize", "runn.wav"]) == 1  # close to "run", but a file name: diarize run's per-file error
    assert "runn.wav: error: no such file" in capsys.readouterr().err  # the path said once


def test_user_error_family_keeps_the_builtin_bases():
    import normlab
    from normlab import _checks

    assert normlab.UserError is _checks.UserError
    for cls, base in [(_checks.BadValue, ValueError), (_checks.BadType, TypeError),
                      (_checks.NotFound, FileNotFoundError), (_checks.MissingDependency, ImportError),
                      (_checks.Unavailable, RuntimeError), (_checks.Unreachable, ConnectionError)]:
        assert issubclass(cls, normlab.UserError) and issubclass(cls, base)
    with pytest.raises(normlab.UserError, match="unknown norm 'groupnorm'"):
        normlab.make_norm("groupnorm", 8)
    with pytest.raises(normlab.UserError, match="does not match the trailing dimensions"):
        normlab.LayerNorm(8)(__import__("torch").randn(2, 7))


@pytest.mark.parametrize("error", [RuntimeError("shape '[0, 0]' is invalid"), KeyError("weight"),
                                   TypeError("unsupported operand"), ValueError("math domain error")])
def test_a_bug_shows_its_traceback_and_says_it_is_a_bug(error, monkeypatch, capsys):
    """Errors that are not UserError are bugs, whatever their class: traceback, a line saying so, exit 1."""
    from normlab.cli import main
    from normlab.lab import accounting

    def broken(preset):
        raise error

    monkeypatch.setattr(accounting, "count_preset", broken)
    assert main(["count"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.strip().splitlines()[-1].startswith(f"normlab count: internal error ({type(error).__name__}): a bug")


def test_a_user_error_from_the_library_is_one_line(monkeypatch, capsys):
    from normlab._checks import NotFound
    from normlab.cli import main
    from normlab.lab import accounting

    def missing(preset):
        raise NotFound("weights.pt: no such file\n(a second line)")

    monkeypatch.setattr(accounting, "count_preset", missing)
    assert main(["count"]) == 2  # one line still, its break written \n (a path may hold one)
    assert capsys.readouterr().err == "normlab count: error: weights.pt: no such file\\n(a second line)\n"
    monkeypatch.setenv("NORMLAB_DEBUG", "1")  # debugging: the user error's traceback too
    with pytest.raises(NotFound):
        main(["count"])


def test_a_path_the_system_refuses_is_one_line_not_a_bug(tmp_path, capsys):
    """An output folder under a file (or without permission) raised NotADirectoryError & co. with a traceback
    and "a bug in normlab": the path is the user's to fix, so one line naming it, exit 2."""
    from normlab.cli import main

    (tmp_path / "afile").write_text("mine")
    assert main(["diarize", "simulate", "--out", str(tmp_path / "afile" / "sim"), "--n-mixtures", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Not a directory" in err[0] and "afile" in err[0] and "internal error" not in err[0]
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("kind", ["too long", "loop"])
@pytest.mark.parametrize("argv", [["diarize", "simulate", "--n-mixtures", "1", "--out", "{p}"],
                                  ["diarize", "score", "{ref}", "{p}.rttm"],
                                  ["diarize", "run", "{wav}", "--out", "{p}"]])
def test_a_name_the_system_will_not_look_up_is_one_line(argv, kind, tmp_path, capsys):
    """A name longer than the file system takes (ENAMETOOLONG) or links that loop (ELOOP) are plain OSErrors, and
    Path.resolve raises RuntimeError on a loop: each printed a traceback and "a bug in normlab"."""
    import numpy as np
    import soundfile as sf

    from normlab.cli import main

    if kind == "loop":
        (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    p = tmp_path / ("x" * 300 if kind == "too long" else "loop1")
    (tmp_path / "ref.rttm").write_text("SPEAKER a 1 0.0 1.0 <NA> <NA> A <NA> <NA>\n")
    sf.write(tmp_path / "a.wav", np.zeros(16000, np.float32), 16000)
    args = [a.format(p=p, ref=tmp_path / "ref.rttm", wav=tmp_path / "a.wav") for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error" not in err[0], err


def test_two_inputs_with_one_name_are_refused_before_any_work(tmp_path, capsys):
    """a/x.wav and b/x.wav both wrote OUT/x.rttm: the second replaced the first. Refused up front."""
    from normlab.cli import main

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.wav").write_bytes(b"")
    assert main(["diarize", "run", "--out", str(tmp_path / "out"), str(tmp_path / "a" / "x.wav"),
                 str(tmp_path / "b" / "x.wav")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would write the same" in err[0] and not (tmp_path / "out").exists()


def test_a_file_beside_the_audio_is_never_replaced(tmp_path, capsys):
    """`diarize x.wav --out .` (the audio's own folder) replaced the user's reference x.rttm there."""
    from normlab.cli import main

    (tmp_path / "x.wav").write_bytes(b"")
    (tmp_path / "x.rttm").write_text("SPEAKER x 1 0.000 1.000 <NA> <NA> alice <NA> <NA>\n")
    outs = (str(tmp_path), str(tmp_path / "." / ""), str(tmp_path / "sub" / ".."))
    for argv in (["--out", out] for out in outs):
        assert main(["diarize", "run", str(tmp_path / "x.wav"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "exists beside its audio" in err[0]
    assert "alice" in (tmp_path / "x.rttm").read_text()
    assert main(["diarize", "run", str(tmp_path / "x.wav"), "--out", str(tmp_path / "rttm")]) == 1  # elsewhere: runs
    assert "an empty file (0 bytes)" in capsys.readouterr().err


def test_a_run_where_every_file_fails_leaves_no_folders_behind(tmp_path, capsys):
    """`diarize nosuch.wav --out o1/` said why and exited 1, but left the empty folder o1/ it had made."""
    from normlab.cli import main

    (tmp_path / "out").mkdir()
    (tmp_path / "text.wav").write_text("hello")
    for out in (tmp_path / "new" / "deeper", tmp_path / "out"):
        assert main(["diarize", "run", str(tmp_path / "nosuch.wav"), str(tmp_path / "text.wav"), "--out",
                     str(out)]) == 1
        assert "no such file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "text.wav"]  # the user's own folder is kept


def test_the_written_path_has_no_doubled_slash(tmp_path, capsys, monkeypatch):
    """`--out out/` printed "wrote out//x.rttm"."""
    from normlab.cli import main
    from normlab.diarization.io.rttm import Turn
    from normlab.diarization.pipeline import api
    from normlab.diarization.pipeline.output import Diarization

    def files(paths, out, on_result, **kw):
        on_result(paths[0], Diarization([Turn("x", 0.0, 2.0, "spk0")], uri="x", duration=3.0))
        return {paths[0]: "ok"}

    monkeypatch.setattr(api, "diarize_files", files)
    assert main(["diarize", "run", "x.wav", "--out", "out/"]) == 0
    assert capsys.readouterr().out.strip() == "x.wav: wrote out/x.rttm (1 speaker, 2.0 s of speech in 3.0 s)"


def test_the_written_path_is_the_file_written(tmp_path, capsys, monkeypatch):
    """`..wav` printed "wrote out.rttm" (a folder joined with "." is the folder) for the file out/..rttm."""
    from normlab.cli import main
    from normlab.diarization.pipeline import api
    from normlab.diarization.pipeline.output import Diarization

    def files(paths, out, on_result, **kw):
        on_result(paths[0], Diarization([], uri=".", duration=3.0))
        return {paths[0]: "ok"}

    monkeypatch.setattr(api, "diarize_files", files)
    assert main(["diarize", "run", "..wav", "--out", "out", "--plot"]) == 0
    assert capsys.readouterr().out.strip() == "..wav: wrote out/..rttm and out/..png (no speech found)"
    assert api.outputs("..wav", "out", "json") == [pathlib.Path("out/..json")]


def test_train_never_replaces_a_model_it_did_not_make(tmp_path, capsys):
    """`train --out` into a folder holding someone's model.pt (no checkpoint there) replaced it."""
    from normlab.cli import main

    (tmp_path / "model.pt").write_text("mine")
    assert main(["diarize", "train", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no training to resume" in err[0]
    assert (tmp_path / "model.pt").read_text() == "mine"


def test_train_refuses_a_folder_where_the_model_goes_before_it_trains(tmp_path, capsys, monkeypatch):
    """With a checkpoint to resume, a folder named model.pt was found only when the model was moved into place,
    after the training, and the error named a temporary file."""
    from normlab.cli import main
    from normlab.diarization.training import train as train_mod

    (tmp_path / "model.pt").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "last.pt").write_text("a checkpoint")
    monkeypatch.setattr(train_mod, "train", lambda *a, **k: pytest.fail("trained before the check"))
    assert main(["diarize", "train", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path / 'model.pt'} is a folder where the model would go" in err[0], err


def test_tune_checks_where_it_writes_before_the_grid_runs(tmp_path, capsys):
    from normlab.cli import main

    (tmp_path / "dev").mkdir()
    for argv, message in ((["--out", str(tmp_path)], "cannot write a file there"),
                          (["--out", str(tmp_path / "no" / "t.json")], "cannot write a file there"),
                          # os.access says yes to root on /proc: the segment cache's path was named later
                          (["--out", "/proc/t.json"], "--out /proc: cannot write there"),
                          (["--test", str(tmp_path / "nosuch")], "no such folder")):
        assert main(["diarize", "tune", "--dev", str(tmp_path / "dev"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]


def test_a_closed_pipe_ends_the_command_quietly():
    """`normlab count --json | head -1`: the reader went away; no traceback, no 'internal error', exit 141."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; from normlab.cli import main; "
                          "sys.exit(main(['count', '--json']))"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before it writes: every write finds the pipe closed
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.mark.skipif(not pathlib.Path("/dev/full").exists(), reason="no /dev/full (a device that is always full)")
def test_output_to_a_full_disk_is_one_line_not_an_internal_error():
    """`normlab count --json > /dev/full`: the write fails with ENOSPC and no file name; it printed a traceback
    and "internal error" (a bug in normlab), where the disk is full."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", "import sys; from normlab.cli import main; "
                            "sys.exit(main(['count', '--json']))"], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert err[0] == "normlab count: error: cannot write its output: No space left on device", err


def test_a_full_disk_under_a_file_is_one_line_and_leaves_stdout_alone(monkeypatch, capsys):
    """ENOSPC without a file name also comes from a file written through its handle: one line, and stdout stays
    the caller's (it was pointed at /dev/null for good); a quota error naming its file is one line too (it was an
    "internal error")."""
    import errno

    from normlab.cli import main
    from normlab.lab import accounting

    for error, says in ((OSError(errno.ENOSPC, "No space left on device"), "cannot write its output: No space"),
                        (OSError(errno.EDQUOT, "Disk quota exceeded", "/data/out.json"),
                         "/data/out.json: Disk quota exceeded")):
        def full(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(accounting, "count_preset", full)
        assert main(["count"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("normlab count: error: ") and says in err[0], err
    print("still the caller's")
    assert capsys.readouterr().out == "still the caller's\n"


def test_ctrl_c_promises_a_resume_only_where_the_command_resumes(monkeypatch, capsys):
    """`bench` and `count` keep nothing to resume from: their Ctrl-C line says interrupted, no more; `report` and
    `diarize train` keep finished work and say so. Exit 130 either way, no traceback."""
    from normlab.cli import diarize as diarize_cli
    from normlab.cli import main
    from normlab.cli import report as report_cli
    from normlab.lab import accounting

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(accounting, "count_preset", stopped)
    monkeypatch.setattr(report_cli, "_report", stopped)
    monkeypatch.setattr(diarize_cli, "_cmd_diarize_train", stopped)
    assert main(["count"]) == 130
    assert capsys.readouterr().err == "normlab count: interrupted\n"
    assert main(["report", "--quick"]) == 130
    assert capsys.readouterr().err == "normlab report: interrupted (finished work is kept; re-run to resume)\n"
    assert main(["diarize", "train", "--data", "d", "--out", "x"]) == 130
    assert "re-run to resume" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["report", "--quick"], ["study", "structure", "--quick"]])
def test_without_matplotlib_the_studies_stop_before_any_work(argv, tmp_path, capsys, no_matplotlib):
    """A plain install (no plot extra) ran the studies' cells, then printed a traceback and "internal error" where
    the first study drew its figure."""
    from normlab.cli import main

    out = tmp_path / "report"
    assert main([*argv, "--jobs", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'normlab[plot]'" in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_run_time_errors_name_the_command_as_usage_errors_do(tmp_path, capsys):
    """Usage errors said `normlab diarize score: error:`, errors while running `normlab diarize: error:`."""
    from normlab.cli import main

    assert main(["diarize", "score", str(tmp_path / "missing.rttm"), str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("normlab diarize score: error: "), err
    assert main(["diarize", "score", "--collar", "-1", "a", "b"]) == 2
    assert capsys.readouterr().err.startswith("normlab diarize score: error: ")


def test_a_failed_cell_is_said_as_it_is_not_as_out_of_memory(capsys):
    """A lost worker's or a failed cell's message may quote "out of memory": it was rewritten as "out of memory
    (...cut at 160 characters): ask for smaller sizes", its own advice (run again to resume) cut off."""
    from normlab import cli
    from normlab._checks import CellsFailed

    said = ("1 of 1 cell of lesson_stats failed (first, seed=0: RuntimeError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB); the finished cells are kept: run the same command again to retry them")

    args = cli.build_parser().parse_args(["lesson"])
    assert cli._failed(args, CellsFailed(said)) == 2
    assert capsys.readouterr().err.strip() == f"normlab lesson: error: {said}"


@pytest.mark.parametrize("argv", [["diarize", "simulate"], ["diarize", "train", "--data", "d"], ["diarize", "recipe"],
                                  ["report"], ["bench"], ["diarize", "run", "a.wav"],
                                  ["diarize", "evaluate", "w", "r"]])
def test_an_out_that_is_a_file_is_said_the_same_way_everywhere(argv, tmp_path, capsys):
    """Each command said it otherwise ("X/wav: Not a directory", "X: File exists"), some after loading models."""
    from normlab.cli import main

    (tmp_path / "f.txt").write_text("mine\n")
    assert main([*argv, "--out", str(tmp_path / "f.txt")]) == 2
    assert "f.txt is a file; this takes a folder" in capsys.readouterr().err
    assert (tmp_path / "f.txt").read_text() == "mine\n"


def _arguments_given(monkeypatch, module, name: str, argv: list[str]) -> dict:
    """The keyword arguments ``main(argv)`` calls ``module.name`` with (stopped there, before any work)."""
    from normlab.cli import main

    asked = {}

    def stand_in(*args, **kw):
        asked.update(kw)
        raise KeyboardInterrupt  # stop before any work: the call's arguments are what the test reads

    monkeypatch.setattr(module, name, stand_in)
    main(argv)
    return asked


def test_report_only_given_twice_runs_both(monkeypatch, tmp_path):
    """`--only lesson_stats --only invariance` ran invariance alone: argparse kept the last --only."""
    from normlab.studies import report

    asked = _arguments_given(monkeypatch, report, "run_studies", [
        "report", "--only", "lesson_stats", "--only", "invariance", "structure", "--out", str(tmp_path / "r")])
    assert asked["only"] == ["lesson_stats", "invariance", "structure"]


def test_bench_lists_given_twice_add_up(monkeypatch, tmp_path):
    """`--shapes 256x64 --shapes 128x64` timed 128x64 alone: argparse kept the last list (report --only adds)."""
    from normlab.lab import bench_files

    asked = _arguments_given(monkeypatch, bench_files, "measure", [
        "bench", "--ops", "layer_norm", "--ops", "rms_norm", "layer_norm", "--shapes", "256x64", "--shapes",
        "128x64", "--dtypes", "float32", "--dtypes", "bfloat16", "--out", str(tmp_path / "b")])
    assert asked["ops"] == ["layer_norm", "rms_norm"]  # each once, in the order given
    assert asked["shapes"] == [(256, 64), (128, 64)] and asked["dtypes"] == ["float32", "bfloat16"]


def test_an_out_of_memory_line_is_cut_at_a_words_end(capsys):
    """torch's allocator message was cut at 160 characters mid-word ("Error code 12 (Cannot alloca)")."""
    from normlab import cli

    text = "DefaultCPUAllocator: not enough memory: you tried to allocate " + "12345 " * 30 + "bytes. Error code 12"
    args = cli.build_parser().parse_args(["lesson"])
    assert cli._failed(args, RuntimeError(text)) == 2
    err = capsys.readouterr().err.strip()
    said = err.split("out of memory (", 1)[1].rsplit("): ask for smaller sizes", 1)[0]
    assert said.endswith("12345 ...") and len(said) <= 164 and "\n" not in err
    assert cli._first_line("short one\nsecond") == "short one"


def test_debug_switch_off_words_keep_the_one_line(monkeypatch, capsys):
    """``NORMLAB_DEBUG=0`` (or false, or empty) turned debugging on: any non-empty value did."""
    from normlab._checks import NotFound
    from normlab.cli import main
    from normlab.lab import accounting

    def missing(preset):
        raise NotFound("weights.pt: no such file")

    monkeypatch.setattr(accounting, "count_preset", missing)
    for off in ("0", "false", "off", " "):
        monkeypatch.setenv("NORMLAB_DEBUG", off)
        assert main(["count"]) == 2
        assert capsys.readouterr().err == "normlab count: error: weights.pt: no such file\n"
    monkeypatch.setenv("NORMLAB_DEBUG", "yes")
    with pytest.raises(NotFound):
        main(["count"])


@pytest.mark.parametrize("argv", [["diarize", "score", "ref.rttm", ""], ["diarize", "score", "", "hyp.rttm"],
                                  ["diarize", "evaluate", "wavs", ""], ["diarize", ""],
                                  ["diarize", "whiten", "", "--train", "sim"]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(argv, tmp_path, monkeypatch, capsys):
    """``score ref.rttm ""`` scored the folder's RTTMs, the reference among them, against it: 0.00%, exit 0."""
    from normlab.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.rttm").write_text("SPEAKER a 1 0.000 1.000 <NA> <NA> A <NA> <NA>\n")
    assert main(argv) == 2
    assert "expected a path, got an empty one" in capsys.readouterr().err


def test_a_library_warning_is_said_with_one_prefix():
    """The library's warnings start "normlab: " for a program that imports it; on the command line that read
    "normlab bench: warning: normlab: NORMLAB_STREAM_BYTES='abc' is not a byte count"."""
    r = _run("import sys, warnings\n"
             "import normlab.lab.lesson as lesson\n"
             "from normlab.cli import main\n"
             "real = lesson.run_lesson\n"
             "def run_lesson(cfg):\n"
             "    warnings.warn('normlab: X=1 is odd', RuntimeWarning)\n"
             "    return real(cfg)\n"
             "lesson.run_lesson = run_lesson\n"
             "sys.exit(main(['lesson']))")
    assert r.returncode == 0 and r.stderr == "normlab lesson: warning: X=1 is odd\n", r.stderr
