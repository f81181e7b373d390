"""The safetensors file format, read and written without the ``safetensors`` package (a compiled dependency
the core install does without): an 8-byte little-endian header length, a JSON header (``{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``), then the tensors' bytes, little-endian
and C-contiguous. The shipped speaker encoders and VAD are stored this way, and BERT checkpoints
(``model.safetensors``) are read with it. ``tests/diarization/test_weights.py`` checks both directions against
the ``safetensors`` package.
"""
from __future__ import annotations

import json
import pathlib
import struct
import sys

import torch

from . import written
from ._checks import BadValue

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


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
