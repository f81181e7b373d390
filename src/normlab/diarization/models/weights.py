"""Weight files: the ones shipped in the package (``assets/``, safetensors), and those inside other installed
packages (found without importing, or running, the packages' code).

The safetensors format is read and written here without the ``safetensors`` package, which would be a
compiled dependency of the core install for two small files: an 8-byte little-endian header length, a
JSON header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``),
then the tensors' bytes, little-endian and C-contiguous. ``tests/diarization/test_weights.py`` checks
both directions against the ``safetensors`` package.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import pathlib
import struct
import sys

import torch

from ... import written
from ..._checks import BadValue, NotFound

#: the package's asset folder (models, weights and their licences)
ASSETS = pathlib.Path(__file__).resolve().parent.parent / "assets"


def is_asset(path: str | pathlib.Path) -> bool:
    """Whether ``path`` is one of the package's own files (its models and weights): never rewritten in place."""
    return ASSETS in pathlib.Path(path).resolve().parents


_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


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


def is_safetensors(path: str | pathlib.Path) -> bool:
    """Whether the file starts as a safetensors file does (a header length, then a JSON object)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{"


def safetensors_metadata(path: str | pathlib.Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, reading only its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return dict(json.loads(f.read(n)).get("__metadata__") or {})


def read_safetensors(path: str | pathlib.Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file; ValueError naming the file when it is not one."""
    data = pathlib.Path(path).read_bytes()
    if sys.byteorder != "little":  # the tensors' bytes are little-endian; torch.frombuffer reads native order
        raise NotImplementedError("reading safetensors files needs a little-endian machine")
    try:
        (n,) = struct.unpack("<Q", data[:8])
        if not 0 < n <= len(data) - 8:
            raise ValueError(f"header length {n} for a {len(data)}-byte file")
        header = json.loads(data[8 : 8 + n])
        meta = header.pop("__metadata__", None) or {}
        body = memoryview(data)[8 + n :]
        tensors = {}
        for name, info in header.items():
            begin, end = info["data_offsets"]
            dtype, shape = _DTYPES[info["dtype"]], [int(s) for s in info["shape"]]
            count = 1
            for s in shape:
                count *= s
            if end - begin != count * torch.empty(0, dtype=dtype).element_size() or end > len(body):
                raise ValueError(f"{name}: {end - begin} bytes for shape {shape} {info['dtype']}")
            flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
            tensors[name] = flat.reshape(shape)
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise BadValue(f"{path} is not a safetensors file: {e}") from None
    return tensors, dict(meta)


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


def write_safetensors(path: str | pathlib.Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` atomically: header padded to 8 bytes, wider dtypes first, then by name (so every tensor
    starts aligned to its element size, as the ``safetensors`` package lays them out)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}, **header}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    path = pathlib.Path(path)
    tmp = written.temporary(path)
    tmp.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(chunks))
    tmp.replace(path)


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
