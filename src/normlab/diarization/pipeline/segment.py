"""Local segmentation: EEND windows, speech gating, and one speaker embedding per piece of speech."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..io.audio import SAMPLE_RATE, resample
from ..io.features import FeatureConfig, extract
from ..models.embed import HOP
from .config import PipelineConfig
from .postprocess import runs


def frame_level_db(wave: torch.Tensor, hop: int, frames: int) -> torch.Tensor:
    """RMS level in dBFS of each of ``frames`` consecutive ``hop``-sample frames ``(frames,)`` (-inf when silent)."""
    x = torch.nn.functional.pad(wave, (0, max(0, frames * hop - wave.numel())))[: frames * hop]
    return 10 * torch.log10(x.view(frames, hop).pow(2).mean(1))


#: the steady-noise test hears the level above this (Hz): most of pink and brown noise's power lies below it,
#: in a few slow components whose level wanders (over 2 s brown noise's broadband level spans 3.5-6 dB, and none
#: of its frames were flat; above 300 Hz, all of them are), while speech rises and falls with its syllables there
FLAT_BAND_HZ = 300.0


def band_level_db(wave: torch.Tensor, sample_rate: int, hop: int, frames: int,
                  cutoff: float = FLAT_BAND_HZ) -> torch.Tensor:
    """:func:`frame_level_db` of ``wave`` high-passed at ``cutoff`` (a 4th-order Butterworth), filtered a
    minute at a time, its state carried from block to block: only the frames' energies are kept (an hour at
    8 kHz held its filtered copy, 115 MB, before)."""
    from scipy.signal import butter, sosfilt

    sos = butter(4, cutoff, "highpass", fs=sample_rate, output="sos")
    x = wave.numpy()[: frames * hop]
    block = max(1, 60 * sample_rate // hop) * hop  # whole frames
    zi = np.zeros((sos.shape[0], 2))  # from rest (the DC offset is already removed)
    energy = np.zeros(frames)
    for a in range(0, x.size, block):
        y, zi = sosfilt(sos, x[a : a + block], zi=zi)
        whole = y.size // hop
        energy[a // hop : a // hop + whole] = np.square(y[: whole * hop]).reshape(whole, hop).sum(1)
        if whole * hop < y.size:  # the recording's last, partial frame (the rest of it silence)
            energy[a // hop + whole] = np.square(y[whole * hop :]).sum()
    with np.errstate(divide="ignore"):
        return torch.from_numpy(10 * np.log10(energy / hop))


#: the recording's loud level and quiet level: these quantiles of its frame levels (a few clicks move neither)
LOUD_QUANTILE, QUIET_QUANTILE = 0.98, 0.10
#: the gate follows a quiet recording only where its loud frames stand this far above its quiet ones: speech
#: and pauses, not stationary noise alone (white, pink and brown noise span 0.7-6.5 dB between those quantiles;
#: the dev conversations, noise added at 3-30 dB SNR, 13 dB and more in 95% of them)
MIN_DYNAMIC_DB = 10.0


def silence_gate_db(level: torch.Tensor, silence_db: float, range_db: float | None) -> float:
    """The level (dBFS) below which a frame is silence whatever the model says: ``silence_db``, or
    ``range_db`` below the recording's loud frames (:data:`LOUD_QUANTILE` of ``level``), whichever is lower,
    where the recording has the dynamics of speech (:data:`MIN_DYNAMIC_DB`).

    The model hears level-free features (log-mel minus the recording's mean), and the speaker encoder raises
    quiet audio to -30 dBFS; a fixed gate was the one stage that heard the level: 20 dB quieter, the pyannote
    sample's quiet speech fell below -70 dBFS and was dropped (5.69% DER became 9.00%; 34 dB quieter,
    62.73%). The gate now moves down with a quiet recording of speech and stays where it was for louder ones
    (loud frames above ``silence_db + range_db``) and for noise alone, which the model, seeing it with the
    recording's mean removed, takes for speech. Digital silence stays silence (-inf)."""
    finite = level[torch.isfinite(level)].double().numpy()
    if range_db is None or finite.size == 0:
        return silence_db
    loud, quiet = (float(v) for v in np.quantile(finite, [LOUD_QUANTILE, QUIET_QUANTILE]))  # any length
    return min(silence_db, loud - range_db) if loud - quiet >= MIN_DYNAMIC_DB else silence_db


def flat_frames(level: torch.Tensor, width: int, range_db: float) -> torch.Tensor:
    """Frames ``(T,)`` bool whose level (dBFS per frame) varies less than ``range_db`` (90th minus 10th
    percentile) over the ``width`` frames centred on them: steady noise, hum, a fan, not speech.

    Speech rises and falls with its syllables and pauses: over 2 s around a frame of speech its 100 ms levels
    span 4.0-4.8 dB or more in 99% of the dev conversations' speech frames (noise at 3-30 dB SNR), while half of
    the frames of steady sounds at least 1 s from any speech span less than 3 dB. So a frame in the middle of a
    long stretch of steady noise is flat, and one whose window holds more than a tenth of louder sound is not."""
    if range_db <= 0 or level.numel() == 0:
        return torch.zeros(level.shape, dtype=torch.bool)
    x = torch.nan_to_num(level.double(), neginf=-200.0)  # digital silence: far below any sound
    padded = torch.nn.functional.pad(x, (width // 2, width - 1 - width // 2), value=float("nan"))
    win = padded.unfold(0, width, 1)  # T, width; near the ends only the frames there are (NaN left out)
    spread = torch.nanquantile(win, 0.9, dim=1) - torch.nanquantile(win, 0.1, dim=1)
    return spread < range_db


def window_starts(frames: int, size: int, step: int) -> list[int]:
    """Start frames of windows of ``size`` every ``step`` covering ``frames`` (the last one ends at the end)."""
    if frames <= size:
        return [0]
    starts = list(range(0, frames - size + 1, step))
    if starts[-1] + size < frames:
        starts.append(frames - size)
    return starts


@torch.no_grad()
def local_activity(model, feats: torch.Tensor, starts: list[int], size: int, batch: int = 16) -> torch.Tensor:
    """Speaker probabilities per window, ``(windows, size, local speakers)`` (short recordings: one shorter window)."""
    model.eval()
    size = min(size, feats.shape[0])
    out = []
    device = next(model.parameters()).device  # inference follows the model's device; results come back to the CPU
    for i in range(0, len(starts), batch):
        x = torch.stack([feats[s : s + size] for s in starts[i : i + batch]])  # b, size, dim
        out.append(model.activity(x.to(device)).cpu())
    return torch.cat(out)


def vad_union(probs: torch.Tensor, speech: torch.Tensor, vad_threshold: float) -> torch.Tensor:
    """Speech where the model or the VAD hears it: in each frame the VAD calls speech (``speech >
    vad_threshold``), the likeliest local speaker's probability rises to the VAD's, if that is higher.

    ``probs (W, size, S)``, ``speech (W, size, 1)``; the other local speakers (overlap) are the model's. The
    model keeps deciding who speaks, and speech the VAD misses (telephone band, far voices) stays the model's.
    """
    boost = torch.where(speech > vad_threshold, speech, torch.zeros(()))
    top = probs.argmax(dim=2, keepdim=True)
    return probs.scatter(2, top, torch.maximum(probs.gather(2, top), boost))


def long_runs(mask: torch.Tensor, min_len: int) -> torch.Tensor:
    """``mask`` kept only in its runs of at least ``min_len`` consecutive True frames."""
    out = torch.zeros_like(mask)
    for a, b in runs(mask):
        if b - a >= min_len:
            out[a:b] = True
    return out


def speaker_pieces(probs: torch.Tensor, threshold: float, min_frames: int,
                   piece: int) -> list[tuple[int, int, int, torch.Tensor | None]]:
    """Where to embed each local speaker of one window ``(size, S)``.

    The window is cut into pieces of ``piece`` frames; for each local speaker
    and each piece where it is active: ``(speaker, start, end, frames)`` with
    the frames to embed (where it is the only active speaker; all its active
    frames when those are fewer than ``min_frames``), or ``None`` when it has
    fewer than ``min_frames`` there (the piece then follows the speaker's
    nearest embedded piece).
    """
    active = probs > threshold  # size, S
    alone = active & (active.sum(1, keepdim=True) == 1)
    out = []
    size = probs.shape[0]
    n_pieces = max(1, round(size / piece))
    edges = [round(i * size / n_pieces) for i in range(n_pieces + 1)]
    for s in range(probs.shape[1]):
        for a, b in zip(edges, edges[1:]):
            if not bool(active[a:b, s].any()):
                continue
            chosen = None
            for mask in (alone[a:b, s], active[a:b, s]):
                if int(mask.sum()) >= min_frames:
                    chosen = a + mask.nonzero().squeeze(1)
                    break
            out.append((s, a, b, chosen))
    return out


@dataclass
class Segmentation:
    """What the model and the encoder say about one recording; clustering and stitching start from here."""

    uri: str
    frames: int  # model frames in the recording
    frame_seconds: float
    starts: list[int]  # first frame of each window
    probs: torch.Tensor  # (windows, window frames, local speakers)
    pieces: list[tuple[int, int, int, int, int]]  # (window, local speaker, start, end, embedding row)
    embeddings: torch.Tensor  # (n, dim), L2-normalized
    weights: np.ndarray  # (n,) seconds of speech behind each embedding
    whitening: torch.Tensor | None = None  # the model file's map of the embeddings (pipeline/whiten.py), if any
    plda: dict | None = None  # the model file's PLDA model of the embeddings (pipeline/vbx.py), if any
    duration: float | None = None  # seconds of audio (to the ms): no turn ends after it (the last frame may)


def segment(model, encoder, wave16k: torch.Tensor, uri: str, cfg: PipelineConfig,
            feature_cfg: FeatureConfig = FeatureConfig(), vad=None) -> Segmentation:
    """Local segmentation of every window and one embedding per (window, local speaker, piece) with enough speech."""
    fs = feature_cfg.frame_seconds
    wave8k = torch.from_numpy(resample(wave16k.numpy(), SAMPLE_RATE, feature_cfg.sample_rate))
    feats = extract(wave8k, feature_cfg)  # T, dim
    T = feats.shape[0]
    duration = round(wave16k.numel() / SAMPLE_RATE, 3)
    if T == 0:
        return Segmentation(uri, 0, fs, [], torch.zeros(0, 0, 0), [], torch.zeros(0, encoder.dim), np.zeros(0),
                            *_embedding_models(model), duration=duration)
    size = max(1, round(cfg.window / fs))
    starts = window_starts(T, size, max(1, round(cfg.step / fs)))
    probs = local_activity(model, feats, starts, size, cfg.batch)  # W, size', S
    if cfg.speakers == "speech":  # speech activity from the model, speaker identity from the embeddings alone
        probs = probs.max(dim=2, keepdim=True).values  # W, size', 1
    windowed = lambda x: torch.stack([x[s0 : s0 + probs.shape[1]] for s0 in starts])[..., None]  # noqa: E731
    hop = round(fs * feature_cfg.sample_rate)
    level = frame_level_db(wave8k, hop, T)  # T
    loud = level > silence_gate_db(level, cfg.silence_db, cfg.silence_range_db)  # T
    if cfg.flat_db > 0:
        band = band_level_db(wave8k, feature_cfg.sample_rate, hop, T)  # T: steady low rumble included
        loud &= ~flat_frames(band, max(1, round(cfg.flat_seconds / fs)), cfg.flat_db)
    if cfg.vad != "off":
        from ..models.vad import default_vad, speech_probability

        speech = speech_probability(vad if vad is not None else default_vad(), wave16k, T, fs)  # T
        if cfg.vad == "speech" and cfg.speakers == "speech":
            probs = windowed(speech)  # W, size', 1
        elif cfg.vad == "union":
            probs = vad_union(probs, windowed(speech), cfg.vad_threshold)
        elif cfg.vad == "veto":
            loud &= ~long_runs(speech <= cfg.vad_threshold, max(1, round(cfg.veto_seconds / fs)))
        else:
            loud &= speech > cfg.vad_threshold
    probs = probs * windowed(loud)  # digital silence (and the VAD's non-speech)
    del feats, wave8k
    mel = encoder.features(wave16k)  # M frames of 10 ms (GE2E: 40 mel powers; CAM++: 80 log mel energies)
    per = round(fs * SAMPLE_RATE / HOP)  # mel frames (10 ms) per model frame
    found, groups, weights = [], [], []
    min_frames, piece = max(1, round(cfg.min_embed / fs)), max(1, round(cfg.piece / fs))
    max_frames = max(min_frames, round(cfg.max_embed / fs))
    for w, s0 in enumerate(starts):
        for s, a, b, idx in speaker_pieces(probs[w], cfg.threshold, min_frames, piece):
            row = None
            if idx is not None:
                idx = idx[: max_frames]  # the first max_embed seconds are enough for one voice (and bound the cost)
                m = ((s0 + idx)[:, None] * per + torch.arange(per)).reshape(-1)
                row = len(groups)
                groups.append(m[m < mel.shape[0]])
                weights.append(idx.numel() * fs)
            found.append((w, s, a, b, row))
    emb = encoder.embed_frames(mel, groups) if groups else torch.zeros(0, encoder.dim)
    del mel
    ok = ~torch.isnan(emb).any(1)
    new_row = (ok.long().cumsum(0) - 1).tolist()
    # pieces without an embedding follow the nearest embedded piece of the same (window, speaker)
    pieces = []
    for w, s, a, b, row in found:
        if row is not None and not bool(ok[row]):
            row = None
        pieces.append((w, s, a, b, None if row is None else new_row[row]))
    out = []
    for w, s, a, b, row in pieces:
        if row is None:
            same = [(abs(a2 - a), r2) for w2, s2, a2, _, r2 in pieces if w2 == w and s2 == s and r2 is not None]
            if not same:
                continue  # this local speaker never had enough speech in this window
            row = min(same)[1]
        out.append((w, s, a, b, row))
    return Segmentation(uri, T, fs, starts, probs, out, emb[ok], np.array(weights)[ok.numpy()] if groups else
                        np.zeros(0), *_embedding_models(model), duration=duration)


def _embedding_models(model) -> tuple[torch.Tensor | None, dict | None]:
    """The model file's whitening map and PLDA model (each None where not fitted)."""
    fitted = getattr(model, "whitening", None) or {}
    return fitted.get("matrix"), fitted.get("plda")
