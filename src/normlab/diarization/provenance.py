"""What a model file was made from: its recipe, data sources with licences, and software versions.

``write`` adds a ``meta`` entry to a saved model file (``EENDModel.load``
ignores it) and ``read`` returns it: ``meta["max_local_speakers"]`` (also
the model config's ``n_speakers``) and ``meta["window_seconds"]`` say how the
model was trained to be used; the rest says how to make it again.
"""
from __future__ import annotations

import os
import pathlib
import platform
import subprocess
from importlib import metadata

import torch

#: licences of the synthesizers and voices the simulation can use (Debian packages; see docs/diarization.md)
LICENCES = {
    "espeak-ng": "GPL-3.0-or-later (program and voice data; used as a tool, audio output not covered)",
    "flite": "BSD-style (CMU Flite licence; voices kal, kal16, awb, rms, slt under the same terms)",
    "festival": "BSD-style (Festival licence, University of Edinburgh)",
    "festvox-kallpc16k": "free, redistributable with or without modification (CSTR/OGI licence)",
    "festvox-kdlpc16k": "free, redistributable with or without modification (CSTR/OGI licence)",
    "festvox-us-slt-hts": "BSD-style (CMU ARCTIC database and HTS voice licences)",
    "sox": "GPL-2.0-or-later (used as a tool for warping)",
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
    try:
        normlab = metadata.version("normlab")
    except metadata.PackageNotFoundError:
        normlab = "unknown"
    return {"normlab": normlab, "torch": str(torch.__version__), "python": platform.python_version(),
            "numpy": metadata.version("numpy"), "machine": platform.machine(), "cpus": str(os.cpu_count())}


def sources(voice_keys: list[str]) -> dict:
    """The synthesizers and voices used, their Debian packages' versions and licences."""
    from .voices import PACKAGES

    synths = {k.split(".", 1)[0] for k in voice_keys}
    packages = sorted({p for s in synths for p in PACKAGES.get(s, ())} | {"sox"})
    return {"voices": sorted(voice_keys), "packages": debian_versions(packages),
            "licences": {p: LICENCES[p] for p in packages}}


def write(path: str | pathlib.Path, meta: dict) -> None:
    """Add ``meta`` to the model file at ``path`` (atomically)."""
    path = pathlib.Path(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    blob["meta"] = meta
    tmp = path.with_suffix(".meta.tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)


def read(path: str | pathlib.Path) -> dict:
    """The ``meta`` entry of a model file (empty for files written before it existed)."""
    return torch.load(pathlib.Path(path), map_location="cpu", weights_only=True).get("meta", {})
