"""What a model file was made from: its recipe, data sources with licences, and software versions.

``write`` adds a ``meta`` entry to a saved model file (``EENDModel.load``
ignores it) and ``read`` returns it: ``meta["max_local_speakers"]`` (also
the model config's ``n_speakers``) and ``meta["window_seconds"]`` say how the
model was trained to be used; the rest says how to make it again (the
file's ``provenance`` entry, written by ``EENDModel.save``, adds the commit
and the machine).
"""
from __future__ import annotations

import json
import pathlib
import subprocess
from importlib import metadata

import torch

from ..._checks import BadValue

#: licences of the synthesizers and voices the simulation can use (Debian packages; see docs/diarization.md)
LICENCES = {
    "espeak-ng": "GPL-3.0-or-later (the program; used as a tool, its audio output is not a derived work)",
    "flite": "BSD-style CMU Flite licence (program and its voices kal, kal16, awb, rms, slt)",
    "festival": "BSD-style Festival licence (University of Edinburgh, CMU)",
    "festvox-kallpc16k": "MIT-style CSTR/CMU voice licence (use, modify, distribute; keep the notice)",
    "festvox-kdlpc16k": "MIT-style CSTR voice licence (use, modify, distribute; keep the notice)",
    "festvox-us-slt-hts": "BSD-3-clause and EST (CMU ARCTIC slt data, HTS voice)",
    "sox": "GPL-2.0-or-later (used as a tool for spectral warping)",
}


def debian_versions(packages: list[str]) -> dict[str, str]:
    """Installed version of each Debian package ("" where unknown)."""
    out = {}
    for p in packages:
        try:
            out[p] = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", p], capture_output=True, text=True,
                                    timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out[p] = ""
    return out


def versions() -> dict[str, str]:
    """normlab, torch, Python (``normlab.provenance``) and numpy versions."""
    from ...provenance import versions as core

    return {**core(), "numpy": metadata.version("numpy")}


def sources(voice_keys: list[str]) -> dict:
    """The synthesizers and voices used, their packages' versions (Debian's; Python's for the neural voices) and
    licences. Recorded persons and neural voices this version does not know (data simulated by another
    version) are listed under ``"unknown"``, without a package or licence."""
    from ..data.neural import voice as neural_voice
    from ..data.prompts import MUSIC_LICENCE, MUSIC_PACKAGE, person
    from ..data.voices import PACKAGES

    unknown = sorted(k for k in voice_keys if not _known(k))
    voice_keys = [k for k in voice_keys if k not in unknown]
    synths = {k.split(".", 1)[0] for k in voice_keys}
    packages = sorted({p for s in synths for p in PACKAGES.get(s, ())} | {"sox"})
    licences = {p: LICENCES[p] for p in packages}
    for key in voice_keys:  # real people: each package's own licence, from its copyright file
        if key.startswith("recorded."):
            who = person(key.split(".", 1)[1])
            licences.update({pkg: who.licence for pkg in who.packages})
    if any(k.startswith("recorded.") for k in voice_keys):
        licences[MUSIC_PACKAGE] = MUSIC_LICENCE
    python_packages = {}
    for key in voice_keys:  # neural voices: the Python package that ships the weights, its version and licence
        if key.startswith("neural."):
            v = neural_voice(key.split(".", 1)[1])
            python_packages[v.package] = _python_version(v.package)
            licences[v.package] = v.licence
    packages = sorted(k for k in licences if k not in python_packages)
    return {"voices": sorted(voice_keys), "packages": {**debian_versions(packages), **python_packages},
            "licences": licences, **({"unknown": unknown} if unknown else {})}


def folder_sources(folders: list) -> dict:
    """:func:`sources` of the voices simulated folders were made from (each one's ``config.json``; a folder without
    one, or with another file under that name, adds none), with the package versions each folder's simulation
    recorded where it has them (those that made the audio, wherever training runs)."""
    from ..data.simulate import MADE_WITH

    keys: set[str] = set()
    made: dict[str, str] = {}  # package versions as simulate found them where the audio was made
    for d in folders:
        conf = pathlib.Path(d) / "config.json"
        try:
            voices = json.loads(conf.read_text()).get("voices") if conf.exists() else []
        except (ValueError, AttributeError):  # not a simulation's settings: its voices are unknown
            voices = []
        keys.update(v for v in (voices if isinstance(voices, list) else []) if isinstance(v, str))
        made.update(_made_with(pathlib.Path(d) / MADE_WITH))
    out = sources(sorted(keys))
    # the versions that made the audio over this machine's (folders of older versions recorded none)
    out["packages"] = {k: made.get(k) or v for k, v in out["packages"].items()}
    return out


def _made_with(path: pathlib.Path) -> dict[str, str]:
    """The package versions a folder's ``made_with.json`` recorded (none where it is missing or not such a file)."""
    try:
        packages = json.loads(path.read_text()).get("packages") if path.exists() else {}
    except (ValueError, AttributeError, OSError):
        return {}
    if not isinstance(packages, dict):
        return {}
    return {k: v for k, v in packages.items() if isinstance(k, str) and isinstance(v, str) and v}


def _known(key: str) -> bool:
    """Whether this version knows the recorded person or neural voice ``key`` names (any other key: yes)."""
    from ..data.neural import voice as neural_voice
    from ..data.prompts import person

    kind, _, name = key.partition(".")
    lookup = {"recorded": person, "neural": neural_voice}.get(kind)
    try:
        return lookup is None or bool(lookup(name))
    except BadValue:
        return False


def _python_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def write(path: str | pathlib.Path, meta: dict) -> None:
    """Add ``meta`` to the model file at ``path`` (atomically)."""
    path = pathlib.Path(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    blob["meta"] = meta
    _save(blob, path)


def _save(blob: dict, path: pathlib.Path) -> None:
    """``blob`` saved over the model file ``path`` whole: through a temporary beside it, removed however the save
    ends (an interrupt left ``m.pipeline.tmp`` behind). A link is followed: the file it names is the model (the
    link was replaced by a file, and the model it named left as it was)."""
    from ... import written

    written.replace_whole(path.resolve(), lambda tmp: torch.save(blob, tmp))


def _writable_model(path: str | pathlib.Path) -> pathlib.Path:
    """``path``, refused in one line where it is one of the package's own model files (a copy can be rewritten)."""
    from ..models.weights import is_asset

    if is_asset(path):
        raise BadValue(f"{path} is one of normlab's own model files: copy it and write into the copy")
    return pathlib.Path(path)


def write_pipeline(path: str | pathlib.Path, modes: dict, speakers: str, tuning: dict,
                   whitened: dict | None = None, ahc: dict | None = None, vbx: dict | None = None,
                   encoders: dict | None = None, vad_speech: dict | None = None) -> None:
    """Store the pipeline settings chosen on a development set in the model file at ``path`` (atomically):
    ``postprocess["modes"][mode]`` for each mode in ``modes``, the default mode ``speakers``, each mode's best
    settings with whitened embeddings (``postprocess["whitened"]``, what ``whiten=True`` uses) and with VBx
    (``postprocess["vbx"]``, what ``clustering="vbx"`` uses), the tree-cut settings of modes whose choice is VBx
    (``postprocess["ahc"]``, what ``clustering="ahc"`` then uses), each speaker encoder's best settings
    (``postprocess["encoders"][name]``, what ``speaker_encoder=name`` uses), the best reading with Silero alone
    deciding speech (``postprocess["vad_speech"]``, what ``vad="speech"`` uses) and how they were chosen
    (``meta["pipeline_tuning"]``: the dev set, its scores, the versions)."""
    path = _writable_model(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    post = blob.setdefault("postprocess", {})
    post["modes"] = {**post.get("modes", {}), **modes}
    if whitened:
        post["whitened"] = {**post.get("whitened", {}), **whitened}
    for name, alternative in (("ahc", ahc), ("vbx", vbx)):
        if alternative:
            post[name] = {**post.get(name, {}), **alternative}
    if encoders:
        post["encoders"] = {name: {**post.get("encoders", {}).get(name, {}), **per_mode}
                            for name, per_mode in {**post.get("encoders", {}), **encoders}.items()}
    if vad_speech:
        post["vad_speech"] = vad_speech
    post["speakers"] = speakers
    blob.setdefault("meta", {})["pipeline_tuning"] = {**tuning, "versions": versions()}
    _save(blob, path)


def write_whitening(path: str | pathlib.Path, fitted: dict) -> None:
    """Store a fitted embedding whitening (``pipeline/whiten.py``) in the model file at ``path`` (atomically),
    with the versions that made it."""
    path = _writable_model(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    blob["whitening"] = {**fitted, "versions": versions()}
    _save(blob, path)


def read(path: str | pathlib.Path) -> dict:
    """The ``meta`` entry of a model file (empty for files written before it existed)."""
    return torch.load(pathlib.Path(path), map_location="cpu", weights_only=True).get("meta", {})
