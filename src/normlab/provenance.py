"""Where a result came from: software versions, git commit and source digest, machine, threads.

One function, :func:`record`, gives the dict that every artifact stores
(``results.json``, ``index.html``, ``bench.json``, model and checkpoint
files). Its values are plain ``str``/``int``/``dict`` so that files loaded with
``torch.load(weights_only=True)`` read it back (``torch.__version__`` is a
``TorchVersion`` and is stored as ``str``). torch is imported only when
:func:`record` runs.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import platform
import shlex
import subprocess
import sys

#: normlab's source files, whose bytes :func:`code_digest` covers
PACKAGE = pathlib.Path(__file__).resolve().parent
_CODE_SUFFIXES = (".py", ".cpp")


@functools.lru_cache(maxsize=None)
def git_commit(package: pathlib.Path | None = None) -> str | None:
    """The commit of the normlab source tree (with ``-dirty`` when it has changes), or None outside one.

    ``package`` (normlab's own folder by default) must be ``src/normlab`` of a checkout whose top holds normlab's
    ``pyproject.toml`` and ``.git``: a wheel installed inside another project's repository (``pip install
    --target``, a vendored copy) has no commit of its own, not that project's.
    """
    package = pathlib.Path(package) if package is not None else PACKAGE
    root = package.parents[1]
    if package.parent.name != "src" or not (root / ".git").exists():
        return None
    try:
        if 'name = "normlab"' not in (root / "pyproject.toml").read_text(errors="replace"):
            return None
        # without the caller's GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE... (set inside a git hook, or by hand): they
        # named another repository's commit, or called a clean checkout dirty
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        run = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=10, env=env)
        head = run("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def code_digest(root: pathlib.Path = PACKAGE) -> str:
    """Hash of every source file under ``root`` (normlab itself by default): what tells two builds of one version
    apart (an installed wheel has no git commit; a study cell's own source does not cover what it calls)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _CODE_SUFFIXES and p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def versions() -> dict:
    """``{"normlab", "torch", "python"}`` as plain strings."""
    import torch

    from . import __version__

    return {"normlab": __version__, "torch": str(torch.__version__), "python": platform.python_version()}


def record() -> dict:
    """Versions, git commit, machine and threads: what every artifact stores under ``"provenance"``."""
    import torch

    return {
        **versions(),
        "git_commit": git_commit(),
        "source_digest": code_digest(),
        "machine": {"system": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
                    "cpu": cpu_name(), "cpus": os.cpu_count() or 0, "hostname": platform.node(),
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "threads": int(torch.get_num_threads()),
        "argv": command(),
    }


def command(argv: list[str] | None = None) -> str:
    """The command that is running, as it can be typed again: ``normlab lesson --json``; under ``python -m``
    (``python -m normlab ...``, ``torchrun -m normlab ...``) ``python -m normlab ...``, not ``__main__.py ...``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    program = os.path.basename(argv[0])
    if program == "__main__.py":  # the package's own folder names it
        program = f"python -m {os.path.basename(os.path.dirname(argv[0]))}"
    return " ".join([program, *(shlex.quote(a) for a in argv[1:])])


def describe(prov: dict) -> str:
    """One line for humans: ``normlab 0.2.0, torch 2.13.0+cpu, Python 3.11.7, commit 466b074, 2 threads on ...``."""
    commit = prov.get("git_commit")
    m = prov.get("machine") or {}
    return (f"normlab {prov.get('normlab')}, torch {prov.get('torch')}, Python {prov.get('python')}"
            + (f", commit {commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}" if commit else "")
            + f", {prov.get('threads')} threads on {m.get('cpu', '?')} ({m.get('cpus', '?')} CPUs)"
            + (f", {m['cuda']}" if m.get("cuda") else ""))


def png_metadata(prov: dict | None = None, **more: str) -> dict:
    """Text chunks for a PNG figure (matplotlib's ``savefig(metadata=...)``): what made it, as :func:`describe`
    says it, with its command line and the caller's own fields (a study's name, a recording's settings)."""
    prov = record() if prov is None else prov
    return {"Software": f"normlab {prov.get('normlab')}", "Source": describe(prov),
            "Comment": prov.get("argv") or "", **{k: str(v) for k, v in more.items()}}
