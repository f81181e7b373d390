"""The safetensors file format, read and written without the ``safetensors`` package (a compiled dependency
the core install does without): an 8-byte little-endian header length, a JSON header (``{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``), then the tensors' bytes, little-endian
and C-contiguous. The shipped speaker encoders and VAD are stored this way, and BERT checkpoints
(``model.safetensors``) are read with it. ``tests/diarization/test_weights.py`` checks both directions against
the ``safetensors`` package.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import struct
import sys

import torch

from . import written
from ._checks import BadType, BadValue

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
           "U8": torch.uint8, "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}
#: elements in one tensor: past it torch's element count overflows
_MOST_ELEMENTS = 2**63


def is_safetensors(path: str | pathlib.Path) -> bool:
    """Whether the file starts as a safetensors file does (a header length, then a JSON object)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{"


def _entries(raw: bytes, size: int) -> tuple[dict[str, tuple[torch.dtype, list[int], int, int]], dict[str, str]]:
    """The header ``raw`` checked against the format, for a body of ``size`` bytes: ``({name: (dtype, shape,
    begin, end)}, metadata)``. ValueError for anything the format rules out: a tensor reading past the body or
    into another's bytes, bytes that belong to no tensor, a shape that is not whole numbers >= 0, metadata that
    is not strings."""
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ is not a map of strings to strings")
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            raise ValueError(f"{name}: no dtype of the format ({str(info)[:60]})")
        dtype, shape, offsets = _DTYPES[info["dtype"]], info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"{name}: shape {str(shape)[:60]} is not a list of whole numbers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"{name}: data_offsets {str(offsets)[:60]} are not two whole numbers")
        count, (begin, end) = math.prod(shape), offsets
        if count >= _MOST_ELEMENTS or not 0 <= begin <= end <= size or \
                end - begin != count * torch.empty(0, dtype=dtype).element_size():
            raise ValueError(f"{name}: bytes {begin} to {end} of {size} for shape {shape} {info['dtype']}")
        entries[name] = (dtype, shape, begin, end)
    at = 0
    for begin, end in sorted((begin, end) for *_, begin, end in entries.values()):
        if begin != at:
            raise ValueError("its tensors' bytes overlap or leave a gap")
        at = end
    if at != size:
        raise ValueError(f"{size - at} bytes after the last tensor")
    return entries, meta


def _split(path, read_body: bool) -> tuple[bytes, bytes | None, int]:
    """``(header, body or None, body size)`` of the file, the header length checked against the file's size
    before anything is read (a 10-byte file claiming a 3 GB header made the reader allocate 3 GB)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{size} bytes, shorter than the header's length")
        (n,) = struct.unpack("<Q", head)
        if not 0 < n <= size - 8:
            raise ValueError(f"header length {n} for a {size}-byte file")
        raw = f.read(n)
        body = f.read() if read_body else None
    return raw, body, size - 8 - n


def safetensors_metadata(path: str | pathlib.Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, reading only its header (checked as :func:`read_safetensors`
    checks it)."""
    try:
        raw, _, size = _split(path, read_body=False)
        return dict(_entries(raw, size)[1])
    except (ValueError, RecursionError) as e:
        raise BadValue(f"{path} is not a safetensors file: {e}") from None


def read_safetensors(path: str | pathlib.Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file; BadValue naming the file when it is not one."""
    if sys.byteorder != "little":  # the tensors' bytes are little-endian; torch.frombuffer reads native order
        raise NotImplementedError("reading safetensors files needs a little-endian machine")
    try:
        raw, body, size = _split(path, read_body=True)
        entries, meta = _entries(raw, size)
    except (ValueError, RecursionError) as e:  # (a JSON nested deeper than Python's recursion limit)
        raise BadValue(f"{path} is not a safetensors file: {e}") from None
    view = memoryview(body)
    tensors = {name: (torch.frombuffer(bytearray(view[begin:end]), dtype=dtype) if end > begin
                      else torch.empty(0, dtype=dtype)).reshape(shape)
               for name, (dtype, shape, begin, end) in entries.items()}
    return tensors, dict(meta)


def write_safetensors(path: str | pathlib.Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` atomically: header padded to 8 bytes, wider dtypes first, then by name (so every tensor
    starts aligned to its element size, as the ``safetensors`` package lays them out)."""
    if sys.byteorder != "little":  # the format's bytes are little-endian; .numpy().tobytes() writes native order
        raise NotImplementedError("writing safetensors files needs a little-endian machine")
    if "__metadata__" in tensors:  # (it was written as a tensor, and read back as the metadata)
        raise BadValue("'__metadata__' is the safetensors header's metadata, not a tensor name")
    unnamed = sorted({str(t.dtype) for t in tensors.values() if t.dtype not in _NAMES})
    if unnamed:
        raise BadType(f"safetensors has no dtype for {', '.join(unnamed)}")
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
    written.replace_whole(path, lambda tmp: tmp.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(chunks)))
