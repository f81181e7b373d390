"""The segmentations ``diarize tune`` has made, kept on disk so that a run that is stopped resumes.

Segmenting the dev files (the model and the speaker encoder over every window) is what a tuning run spends
its time on, once per segmentation setting; scoring the stitch settings on them is fast. Each recording's
:class:`~normlab.diarization.pipeline.segment.Segmentation` for a setting is written as soon as it is made,
under a key of everything it depends on: the model's and the encoders' weights, the setting, and the file
(its path, size and modification time). A rerun reads what is there and segments the rest. The files hold
tensors, numbers and strings only (read without running code); ``diarize tune`` removes the folder once its
result is written.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
from dataclasses import asdict

import numpy as np
import torch

from ... import written
from .segment import Segmentation, _embedding_models

#: what a cached segmentation holds (the model file's whitening and PLDA come from the model at reading)
FIELDS = ("uri", "frames", "frame_seconds", "starts", "probs", "pieces", "embeddings", "weights", "duration")


def segments_beside(out: str | os.PathLike) -> pathlib.Path:
    """The cache folder of a tuning whose result goes to ``out``: ``.NAME.segments`` beside it."""
    out = pathlib.Path(out)
    return out.with_name(f".{out.name}.segments")


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 over a module's parameters and buffers (names, shapes, dtypes, values)."""
    h = hashlib.sha256()
    hash_value(h, dict(module.state_dict()))
    return h.hexdigest()


def hash_value(h, value) -> None:
    """Feed ``value`` to the hash ``h`` whole: a tensor's or array's dtype, shape and bytes (a repr elides them),
    a mapping's items in key order, a sequence's items; anything else by its repr."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)  # (a 0-dim buffer cannot be viewed as bytes)
        h.update(f"tensor|{value.dtype}|{tuple(value.shape)}|".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif hasattr(value, "dtype") and hasattr(value, "tobytes"):  # a numpy array or number
        h.update(f"array|{value.dtype}|{getattr(value, 'shape', ())}|".encode() + value.tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(f"{k!r}:".encode())
            hash_value(h, value[k])
    elif isinstance(value, (list, tuple)):
        for v in value:
            hash_value(h, v)
    else:
        h.update(f"{value!r};".encode())


class SegmentCache:
    """``folder`` of segmentations made with ``model`` and ``encoders`` (``{name: module}``)."""

    def __init__(self, folder: str | os.PathLike, model, encoders: dict):
        self.folder = pathlib.Path(folder)
        self.model = model
        features = asdict(model.features) if hasattr(model, "features") else {}
        self._made_with = (weights_digest(model), repr(sorted(features.items())),
                           tuple((name, weights_digest(e)) for name, e in sorted(encoders.items())))

    def _file(self, path: pathlib.Path, cfg) -> pathlib.Path:
        st = path.stat()
        key = repr((self._made_with, repr(cfg), str(path.resolve()), st.st_size, st.st_mtime_ns))
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"

    def get(self, path: pathlib.Path, cfg) -> Segmentation | None:
        """The segmentation of ``path`` at ``cfg`` made before, or None (none, or a file that cannot be read:
        a kill inside its write leaves only a temporary, but a disk can fail too)."""
        f = self._file(path, cfg)
        try:
            blob = torch.load(f, map_location="cpu", weights_only=True)
            fields = {k: blob[k] for k in FIELDS}
        except Exception:  # noqa: BLE001   (none yet, or unreadable: made again)
            return None
        fields["weights"] = fields["weights"].numpy()
        fields["pieces"] = [tuple(p) for p in fields["pieces"]]
        whitening, plda = _embedding_models(self.model)
        return Segmentation(**fields, whitening=whitening, plda=plda)

    def put(self, path: pathlib.Path, cfg, seg: Segmentation) -> None:
        """Keep ``seg`` (of ``path`` at ``cfg``), whole or not at all."""
        self.folder.mkdir(parents=True, exist_ok=True)
        f = self._file(path, cfg)
        blob = {k: getattr(seg, k) for k in FIELDS}
        blob["weights"] = torch.from_numpy(np.ascontiguousarray(seg.weights))
        blob["pieces"] = [list(p) for p in seg.pieces]
        written.replace_whole(f, lambda tmp: torch.save(blob, tmp))


def remove(folder: str | os.PathLike) -> None:
    """Remove a cache folder's segmentations, and the folder where nothing else is in it."""
    folder = pathlib.Path(folder)
    for f in [*folder.glob("*.pt"), *folder.glob(".*.pt.*.tmp")]:  # (a kill inside a write leaves its temporary)
        f.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # absent, or something else is there
        pass
