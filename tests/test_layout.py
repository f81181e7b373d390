"""The package layout: old import paths forward with a warning; the CLI's help needs no torch."""
import importlib
import subprocess
import sys

import pytest

OLD_PATHS = {
    "normlab.block": "TransformerBlock", "normlab.encoder": "TransformerEncoder", "normlab.conformer": "ConformerBlock",
    "normlab.video": "VideoEncoder", "normlab.bert": "load_bert", "normlab.attention": "MultiHeadSelfAttention",
    "normlab.feedforward": "FeedForward", "normlab.positional": "PositionalEncoding", "normlab.lesson": "run_lesson",
    "normlab.diagnostics": "diagnose", "normlab.accounting": "count_preset", "normlab.bench": "run",
    "normlab.placement": "Residual",
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_old_paths_forward_with_a_deprecation_warning(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        mod = importlib.import_module(old)
    assert hasattr(mod, OLD_PATHS[old])


def test_old_placement_path_keeps_its_names():
    sys.modules.pop("normlab.placement", None)
    with pytest.warns(DeprecationWarning):
        P = importlib.import_module("normlab.placement")
    from normlab.models import placement
    from normlab.nn.residual import ResidualUnit

    assert P.Residual is ResidualUnit and P.slots is placement.slots and P.deepnorm_beta is placement.deepnorm_beta


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
    (["lesson", "--d-model", "0"], "expected a number >= 1"),
    (["diarize", "train", "--data", "d", "--out", "o", "--norm", "groupnorm"], "invalid choice: 'groupnorm'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--placement", "middle"], "invalid choice: 'middle'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--encoder", "lstm"], "invalid choice: 'lstm'"),
    (["diarize", "train", "--data", "d", "--out", "o", "--decay", "linear"], "invalid choice: 'linear'"),
    (["diarize", "score", "/nonexistent.rttm", "/nonexistent"], "error"),
    (["count", "--preset", "gpt"], "invalid choice: 'gpt'"),
])
def test_user_errors_are_one_line_and_exit_2(argv, message, capsys):
    from normlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]
