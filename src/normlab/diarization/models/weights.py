"""Weight files inside installed packages, found without importing (or running) the packages' code."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib


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
