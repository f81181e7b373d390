"""Simulated mixtures as training batches: features and frame labels, cached per mixture."""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
from dataclasses import asdict

import torch

from ..._checks import BadValue
from ..io.audio import read_mono
from ..io.features import RULES, FeatureConfig, extract
from ..io.rttm import read_rttm


def frame_labels(turns, speakers: list[str], frames: int, frame_seconds: float) -> torch.Tensor:
    """``(frames, len(speakers))`` 0/1: a frame is active if its centre lies inside a turn."""
    y = torch.zeros(frames, len(speakers))
    centres = (torch.arange(frames) + 0.5) * frame_seconds
    for t in turns:
        y[(centres >= t.start) & (centres < t.end), speakers.index(t.speaker)] = 1
    return y


def _digest(wav: pathlib.Path) -> str:
    """A short digest of the file's bytes."""
    h = hashlib.blake2b(digest_size=16)
    with open(wav, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_cache(cache: pathlib.Path, wav: pathlib.Path, cfg: FeatureConfig, stamp: list) -> tuple:
    """``(features, False)`` if ``cache`` belongs to ``wav`` and ``cfg``; else ``(None, broken)``, broken where the
    cache cannot be read as one (truncated, foreign, of the wrong shape) rather than stale."""
    try:
        blob = torch.load(cache, weights_only=True)
    except Exception:  # truncated or foreign: torch's errors have many types
        return None, True
    if isinstance(blob, (torch.Tensor, tuple)):  # an older cache (features alone, or with labels): tied to no WAV
        return None, False
    feats = blob.get("feats") if isinstance(blob, dict) else None
    if not (isinstance(feats, torch.Tensor) and feats.dtype.is_floating_point and feats.dim() == 2):
        return None, True
    if blob.get("features") != asdict(cfg) or blob.get("rules", 1) != RULES or (
            blob.get("stamp") != stamp and blob.get("digest") != _digest(wav)):
        return None, False  # another feature setup or version, or another WAV (a copy keeps the digest, not the time)
    return (feats, False) if feats.shape[1] == cfg.dim else (None, True)


def _cached_features(wav: pathlib.Path, cfg: FeatureConfig, broken: list) -> torch.Tensor:
    """The features of ``wav``, from its cache ``<uri>.feats.pt`` where that belongs to this WAV and ``cfg``.

    The cache keeps the feature setup, the extractor's version (``RULES``) and the WAV's size, modification time
    and digest beside the features.
    Any other cache is rebuilt from the WAV, atomically; one that could not be read is appended to ``broken``.
    """
    cache = wav.with_suffix(".feats.pt")
    st = wav.stat()
    stamp = [st.st_size, st.st_mtime_ns]
    if cache.exists():
        feats, bad = _read_cache(cache, wav, cfg, stamp)
        if feats is not None:
            return feats
        if bad:
            broken.append(cache)
    digest = _digest(wav)  # before reading: a WAV changed meanwhile then fails both checks next time
    feats = extract(read_mono(wav, cfg.sample_rate), cfg)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    try:
        torch.save({"feats": feats, "features": asdict(cfg), "rules": RULES, "stamp": stamp, "digest": digest}, tmp)
        os.replace(tmp, cache)  # atomic: a reader in another process never sees half a file
    except OSError:  # a read-only folder or a full disk: the features are used uncached
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return feats


class MixtureSet:
    """Features ``(T, dim)`` and labels ``(T, n_speakers)`` of every ``wav/<uri>.wav`` in simulated folders."""

    def __init__(self, folders: str | pathlib.Path | list, n_speakers: int = 2, cfg: FeatureConfig = FeatureConfig()):
        self.cfg = cfg  # the feature setup (a model trained on this set carries it)
        folders = [pathlib.Path(f) for f in (folders if isinstance(folders, (list, tuple)) else [folders])]
        wavs = []
        for folder in folders:
            found = sorted((folder / "wav").glob("*.wav"))
            if not found:
                raise BadValue(f"{folder} has no wav/*.wav mixtures (run `normlab diarize simulate --out {folder}`)")
            wavs += found
        self.items, self.uris = [], [wav.stem for wav in wavs]
        crowded = 0  # mixtures with more speakers than the model has outputs
        broken = []  # caches that could not be read, rebuilt
        for wav in wavs:
            feats = _cached_features(wav, cfg, broken)
            # labels are cheap and depend on n_speakers: made here, never cached
            named = read_rttm(wav.with_suffix(".rttm"))
            if named and wav.stem not in named:  # (renamed files: the mixture was labelled silence, without a word)
                raise BadValue(f"{wav.with_suffix('.rttm')} names the recording {sorted(named)[0]!r}, not "
                               f"{wav.stem!r}: each wav/<name>.rttm labels wav/<name>.wav")
            turns = named.get(wav.stem, [])
            crowded += len({t.speaker for t in turns}) > n_speakers
            speakers = sorted({t.speaker for t in turns})[:n_speakers]
            speakers += [f"_absent{k}" for k in range(n_speakers - len(speakers))]
            labels = frame_labels([t for t in turns if t.speaker in speakers], speakers, feats.shape[0],
                                  cfg.frame_seconds)
            self.items.append((feats, labels))
        import warnings

        if broken:
            warnings.warn(f"{len(broken)} feature cache{'s' * (len(broken) > 1)} could not be read ({broken[0]}"
                          f"{', ...' * (len(broken) > 1)}): rebuilt from the WAVs", UserWarning, stacklevel=2)
        if crowded:
            warnings.warn(f"{crowded} of {len(wavs)} mixtures have more than {n_speakers} speakers: the model has "
                          f"{n_speakers} outputs, so their other speakers are labelled silence (raise n_speakers)",
                          UserWarning, stacklevel=2)

    def joined(self, other: "MixtureSet") -> "MixtureSet":
        """Both sets' recordings in one (the items are shared, not copied)."""
        import copy

        both = copy.copy(self)
        both.items, both.uris = self.items + other.items, self.uris + other.uris
        return both

    def batches(self, batch: int = 8, frames: int = 500):
        """A function ``gen -> (feats, labels, pad mask)`` drawing random ``frames``-long windows (shorter
        mixtures padded; a window longer than every mixture is refused: it would be padding, at attention's
        quadratic cost)."""
        longest = max(f.shape[0] for f, _ in self.items)
        if frames > longest:
            raise BadValue(f"frames={frames} is longer than every mixture (the longest has {longest} frames): "
                           f"use at most {longest}")

        def draw(gen: torch.Generator):
            feats, labels, masks = [], [], []
            for i in torch.randint(len(self.items), (batch,), generator=gen).tolist():
                f, y = self.items[i]
                start = int(torch.randint(max(1, f.shape[0] - frames + 1), (1,), generator=gen))
                f, y = f[start : start + frames], y[start : start + frames]
                pad = frames - f.shape[0]
                feats.append(torch.cat([f, f.new_zeros(pad, f.shape[1])]))
                labels.append(torch.cat([y, y.new_zeros(pad, y.shape[1])]))
                masks.append(torch.arange(frames) >= frames - pad)
            return torch.stack(feats), torch.stack(labels), torch.stack(masks)

        return draw
