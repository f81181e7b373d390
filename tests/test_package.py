"""The package's own namespace: names imported on first use."""
import os
import subprocess
import sys

import pytest


def test_dir_lists_each_public_name_once_and_every_one_resolves():
    # a fresh interpreter: the names start unimported, then `import *` puts them in the module's globals
    code = ("import normlab; before = dir(normlab); from normlab import *; after = dir(normlab); "
            "assert len(after) == len(set(after)), [n for n in set(after) if after.count(n) > 1]; "
            "assert set(normlab.__all__) <= set(before) <= set(after); "
            "[getattr(normlab, n) for n in normlab.__all__]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_artifact_names_the_source_it_came_from():
    """Outside a git checkout (an installed wheel) the commit is None and the version string stays the same from
    build to build: the record also holds a digest of normlab's own source files."""
    import re

    from normlab.provenance import code_digest, record

    rec = record()
    assert re.fullmatch(r"[0-9a-f]{16}", rec["source_digest"]) and rec["source_digest"] == code_digest()


def test_the_commit_recorded_is_normlabs_own_not_an_enclosing_repositorys(tmp_path):
    """A wheel installed with `pip install --target vendor` inside a user's git repository recorded that
    repository's commit as normlab's in every model file, checkpoint and results.json."""
    import shutil

    from normlab.provenance import git_commit

    if shutil.which("git") is None:
        pytest.skip("needs git")

    def repo(top, pyproject):
        top.mkdir(parents=True)
        (top / "pyproject.toml").write_text(pyproject)
        env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
               "GIT_COMMITTER_EMAIL": "a@b", "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
        for args in (["init", "-q"], ["add", "pyproject.toml"], ["commit", "-q", "-m", "x"]):
            subprocess.run(["git", "-C", str(top), *args], check=True, env=env, capture_output=True)
        return subprocess.run(["git", "-C", str(top), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()

    theirs = repo(tmp_path / "project", '[project]\nname = "their-app"\n')
    for installed in ("vendor/normlab", "src/normlab", "lib/site-packages/normlab"):
        (tmp_path / "project" / installed).mkdir(parents=True)
        assert git_commit(tmp_path / "project" / installed) is None, installed
    ours = repo(tmp_path / "checkout", '[project]\nname = "normlab"\n')
    (tmp_path / "checkout" / "src" / "normlab").mkdir(parents=True)
    assert git_commit(tmp_path / "checkout" / "src" / "normlab") == ours != theirs
    # git's own variables of the caller (inside a git hook) named the other repository's commit, or a clean
    # checkout dirty
    for var, value in (("GIT_DIR", tmp_path / "project" / ".git"), ("GIT_WORK_TREE", tmp_path / "project")):
        with pytest.MonkeyPatch.context() as m:
            m.setenv(var, str(value))
            assert git_commit.__wrapped__(tmp_path / "checkout" / "src" / "normlab") == ours, var


def test_the_command_recorded_can_be_typed_again():
    """Under `python -m normlab` (and `torchrun -m normlab`) every artifact recorded `__main__.py lesson ...`."""
    from normlab.provenance import command

    assert command(["/venv/bin/normlab", "lesson", "--json"]) == "normlab lesson --json"
    assert command(["/src/normlab/__main__.py", "lesson", "--json"]).endswith(" -m normlab lesson --json")
    assert command(["normlab", "diarize", "my file.wav"]) == "normlab diarize 'my file.wav'"
    out = subprocess.run([sys.executable, "-m", "normlab", "lesson", "--json", "--d-model", "8", "--tokens", "4"],
                         capture_output=True, text=True, timeout=300)
    assert '"argv": "python -m normlab lesson --json --d-model 8 --tokens 4"' in out.stdout, out.stdout[-500:]
