"""Weight files: the ones shipped in the package (``assets/``, safetensors: ``normlab/safetensors_file.py``
reads and writes them), and those inside other installed packages (found without importing, or running, the
packages' code).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import pathlib

import torch

from ..._checks import BadValue, NotFound
from ...safetensors_file import (  # noqa: F401 (this module's names for them)
    is_safetensors,
    read_safetensors,
    safetensors_metadata,
    write_safetensors,
)

#: the package's asset folder (models, weights and their licences)
ASSETS = pathlib.Path(__file__).resolve().parent.parent / "assets"


def is_asset(path: str | pathlib.Path) -> bool:
    """Whether ``path`` is one of the package's own files (its models and weights): never rewritten in place."""
    return ASSETS in pathlib.Path(path).resolve().parents


class MissingAssetError(NotFound):
    """A file that ships inside normlab is not where the package put it (a damaged install)."""


def asset(name: str, error: type[MissingAssetError] = MissingAssetError) -> pathlib.Path:
    """``assets/<name>``; ``error`` (one line naming the file and the fix) when the install lacks it."""
    path = ASSETS / name
    if not path.is_file():
        raise error(f"{path} is missing from this normlab installation (it ships in the package): "
                                "reinstall it with `pip install --force-reinstall --no-deps normlab`")
    return path


def sha256(path: str | pathlib.Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_weights(path: str | pathlib.Path, not_ours: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors weight file; BadValue ``"<not_ours>: <why>"`` where it is not one."""
    try:
        return read_safetensors(path)[0]
    except BadValue as e:  # truncated, or another header
        raise BadValue(f"{not_ours}: {e}") from None


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], not_ours: str) -> torch.nn.Module:
    """``model`` (in eval mode) with the tensors of ``state`` it names (others ignored); BadValue
    ``"<not_ours>: ..."`` where some are missing or have other shapes."""
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise BadValue(f"{not_ours}: it lacks the encoder's tensors ({', '.join(sorted(missing)[:3])}, ...)")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # the right names with other shapes
        first = str(e).strip().splitlines()[-1].strip() if str(e).strip() else ""
        raise BadValue(f"{not_ours}: its tensors have other shapes ({first[:160]})") from None
    return model.eval()


def installed_file(distribution: str, relative: str) -> pathlib.Path | None:
    """``relative`` (``"package/.../file"``) in the installed ``distribution``, else in the folder of
    ``package`` on the import path (found, not imported); None when neither has it."""
    try:
        path = pathlib.Path(importlib.metadata.distribution(distribution).locate_file(relative))
        if path.is_file():
            return path
    except importlib.metadata.PackageNotFoundError:
        pass
    package, _, rest = relative.partition("/")
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = pathlib.Path(folder) / rest
        if path.is_file():
            return path
    return None
