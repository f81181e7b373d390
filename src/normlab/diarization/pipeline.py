"""Segmentation + embedding + clustering: any number of speakers (pyannote.audio 3.x, EEND-VC).

1. **Local segmentation.** The EEND model reads short overlapping windows
   (``window`` seconds every ``step``) and gives, per window, the activity of
   its few local speakers (2-4, the model's ``n_speakers``). Frames below
   ``silence_db`` and, with ``vad="gate"`` (the default), frames Silero VAD
   (``vad.py``) calls non-speech are silence whatever the model says.
2. **Pieces.** ``speakers="speech"`` (the default): the model's speech, any
   local speaker, cut into ``piece``-second pieces whose speaker the
   embeddings alone decide (best on real speech, one speaker at a time).
   ``speakers="eend"``: the model's own local speakers, overlap kept (best on
   simulated conversations). Each mode has its defaults (``MODE_DEFAULTS``).
3. **Embeddings.** For each piece with enough speech, a GE2E speaker
   embedding (``embed.py``) of its frames (in ``eend`` mode, where that local
   speaker is the only one active; all its active frames when those are too few).
4. **Clustering.** Average-linkage agglomerative clustering of all those
   embeddings across the recording (``cluster.py``): a tuned cosine-distance
   threshold, or ``num_speakers``, or ``min_speakers``/``max_speakers``.
5. **Stitching.** Each piece's probabilities go to its cluster; local
   speakers of one window in the same cluster are merged (maximum); the
   windows covering a frame are averaged per global speaker. As in
   pyannote, the windows' mean count of distinct active speakers says how
   many global speakers talk in each frame, and that many of the likeliest
   are switched on; a median filter, then RTTM turns. Two global speakers
   active on one frame is overlap, kept.

Memory is bounded by the window, not the recording: features, mel frames and
VAD probabilities are computed in blocks, the model sees ``batch`` windows at
a time, and what is kept per recording is small per frame (a 1-hour file
stays well under 2 GB).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import BadValue, check_choice
from .cluster import check_speaker_counts, cluster
from .features import FeatureConfig, logmel
from .postprocess import median_filter, to_turns
from .rttm import Turn

#: post-processing a model file may set (its ``postprocess`` dict); anything else there is ignored
TUNABLE = ("threshold", "median", "window", "step", "cluster_threshold", "min_embed", "max_embed", "min_cluster",
           "piece", "speakers", "vad", "vad_threshold")


#: each speakers mode's own defaults, tuned on its development data (docs/diarization.md): speech at 0.5 in
#: 1.5 s pieces judged by their embeddings, on real speech and the natural-voice dev conversations; the
#: model's local speakers over a whole window (and the model file's threshold), on the dev conversations
MODE_DEFAULTS = {"speech": {"threshold": 0.5, "piece": 1.5, "cluster_threshold": 0.3, "min_cluster": 3.0},
                 "eend": {"piece": 10.0, "cluster_threshold": 0.25, "min_cluster": 2.0}}


@dataclass(frozen=True)
class PipelineConfig:
    window: float = 10.0  # seconds per local segmentation window (a few turns, few local speakers)
    step: float = 5.0  # seconds between window starts: each frame is seen by ~window/step windows
    threshold: float = 0.5  # speaker activity threshold on the aggregated probabilities (the model file's)
    median: int = 11  # median filter width, frames (the model file's)
    cluster_threshold: float = 0.3  # cosine distance where the tree is cut (per mode: MODE_DEFAULTS)
    min_embed: float = 0.5  # seconds of a local speaker's speech needed for its embedding
    max_embed: float = 3.0  # seconds of it used at most (two 1.6 s partials)
    min_cluster: float = 3.0  # seconds: clusters with less speech fold into the nearest larger one (per mode)
    piece: float = 1.5  # seconds: a local speaker gets one embedding per piece of its window (per mode)
    speakers: str = "speech"  # "speech": the model's speech (any local speaker), cut into pieces, each piece's
    #                           speaker from its embedding; "eend": the model's local speakers (overlap kept)
    silence_db: float = -70.0  # frames quieter than this (dBFS) are never speech, whatever the model says
    vad: str = "gate"  # "gate": frames Silero VAD calls non-speech are silence whatever the model says;
    #                    "speech": the VAD's probability is the speech activity (speakers="speech"); "off"
    vad_threshold: float = 0.5  # speech probability above which a frame is speech for the VAD
    batch: int = 16  # windows per model call

    @classmethod
    def for_model(cls, model, **overrides) -> "PipelineConfig":
        """The pipeline's defaults, the model file's ``postprocess``, the mode's, then ``overrides`` (None ignored).

        The model file's post-processing was chosen for the model's own local
        speakers, so in ``eend`` mode it wins over ``MODE_DEFAULTS["eend"]``;
        ``speech`` mode reads the model differently (any speaker, gated) and its
        own settings (``MODE_DEFAULTS["speech"]``) win over the file's.
        ``overrides`` win over everything.
        """
        stored = {k: v for k, v in getattr(model, "postprocess", {}).items() if k in TUNABLE}
        given = {k: v for k, v in overrides.items() if v is not None}
        mode = given.get("speakers", stored.get("speakers", cls.speakers))
        mode_kw = MODE_DEFAULTS.get(mode, {})
        kw = {**stored, **mode_kw, **given} if mode == "speech" else {**mode_kw, **stored, **given}
        unknown = set(kw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise BadValue(f"unknown pipeline option(s) {sorted(unknown)}")
        cfg = cls(**kw)
        if cfg.window <= 0 or not 0 < cfg.step <= cfg.window:
            raise BadValue(f"need 0 < step <= window, got window={cfg.window}, step={cfg.step}")
        check_choice(cfg.speakers, ("eend", "speech"), "speakers mode")
        check_choice(cfg.vad, ("off", "gate", "speech"), "vad mode")
        return cfg


def eend_features(wave8k: torch.Tensor, cfg: FeatureConfig = FeatureConfig(), block: int = 60_000) -> torch.Tensor:
    """``features.extract`` computed in blocks of ``block`` STFT frames: the same ``(T_out, dim)`` in bounded memory."""
    n, span = wave8k.numel(), max(cfg.win, cfg.n_fft)  # torch.stft frames span n_fft samples
    if n < span:
        return torch.zeros(0, cfg.dim)
    frames = 1 + (n - span) // cfg.hop
    parts = []
    for a in range(0, frames, block):
        b = min(frames, a + block)
        parts.append(logmel(wave8k[a * cfg.hop : (b - 1) * cfg.hop + span], cfg))  # b-a, n_mels
    f = torch.cat(parts)
    f = f - f.mean(dim=0, keepdim=True)  # recording mean removed
    centres = torch.arange(0, frames, cfg.subsample)  # T_out
    idx = (centres[:, None] + torch.arange(-cfg.context, cfg.context + 1)).clamp(0, frames - 1)  # T_out, 2c+1
    return f[idx].reshape(len(centres), -1)  # T_out, (2c+1) n_mels


def frame_level_db(wave: torch.Tensor, hop: int, frames: int) -> torch.Tensor:
    """RMS level in dBFS of each of ``frames`` consecutive ``hop``-sample frames ``(frames,)`` (-inf when silent)."""
    x = torch.nn.functional.pad(wave, (0, max(0, frames * hop - wave.numel())))[: frames * hop]
    return 10 * torch.log10(x.view(frames, hop).pow(2).mean(1))


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
        out.append(torch.sigmoid(model(x.to(device))).cpu())
    return torch.cat(out)


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


def long_mel(encoder, wave16k: torch.Tensor, block: int = 6000) -> torch.Tensor:
    """The encoder's mel frames ``(frames, 40)`` for a whole recording, in blocks of ``block`` frames."""
    from .embed import HOP, N_FFT

    wave = encoder.normalize_volume(wave16k)
    padded = torch.nn.functional.pad(wave, (N_FFT // 2, N_FFT // 2))  # centred frames, zero padding
    frames = 1 + wave.numel() // HOP
    parts = []
    for a in range(0, frames, block):
        b = min(frames, a + block)
        seg = padded[a * HOP : (b - 1) * HOP + N_FFT]
        spec = torch.stft(seg, N_FFT, hop_length=HOP, window=encoder.frontend.window, center=False,
                          return_complex=True)  # F, b-a
        parts.append(spec.abs().pow(2).T @ encoder.frontend.fbank.T)
    return torch.cat(parts).float()


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


def segment(model, encoder, wave16k: torch.Tensor, uri: str, cfg: PipelineConfig,
            feature_cfg: FeatureConfig = FeatureConfig(), vad=None) -> Segmentation:
    """Local segmentation of every window and one embedding per (window, local speaker, piece) with enough speech."""
    from .audio import resample

    fs = feature_cfg.frame_seconds
    wave8k = torch.from_numpy(resample(wave16k.numpy(), 16000, feature_cfg.sample_rate))
    feats = eend_features(wave8k, feature_cfg)  # T, dim
    T = feats.shape[0]
    if T == 0:
        return Segmentation(uri, 0, fs, [], torch.zeros(0, 0, 0), [], torch.zeros(0, 256), np.zeros(0))
    size = max(1, round(cfg.window / fs))
    starts = window_starts(T, size, max(1, round(cfg.step / fs)))
    probs = local_activity(model, feats, starts, size, cfg.batch)  # W, size', S
    if cfg.speakers == "speech":  # speech activity from the model, speaker identity from the embeddings alone
        probs = probs.max(dim=2, keepdim=True).values  # W, size', 1
    windowed = lambda x: torch.stack([x[s0 : s0 + probs.shape[1]] for s0 in starts])[..., None]  # noqa: E731
    loud = frame_level_db(wave8k, round(fs * feature_cfg.sample_rate), T) > cfg.silence_db  # T
    if cfg.vad != "off":
        from .vad import default_vad, speech_probability

        speech = speech_probability(vad if vad is not None else default_vad(), wave16k, T, fs)  # T
        if cfg.vad == "speech" and cfg.speakers == "speech":
            probs = windowed(speech)  # W, size', 1
        else:
            loud &= speech > cfg.vad_threshold
    probs = probs * windowed(loud)  # digital silence (and the VAD's non-speech)
    del feats, wave8k
    mel = long_mel(encoder, wave16k)  # M, 40
    per = round(fs * 100)  # mel frames (10 ms) per model frame
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
    emb = encoder.embed_frames(mel, groups) if groups else torch.zeros(0, 256)
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
                        np.zeros(0))


def stitch(seg: Segmentation, cfg: PipelineConfig, *, num_speakers: int | None = None,
           min_speakers: int | None = None, max_speakers: int | None = None) -> list[Turn]:
    """Cluster the embeddings, map local speakers to global ones, average over windows, threshold: turns."""
    lo, _ = check_speaker_counts(num_speakers, min_speakers, max_speakers)
    if not seg.pieces:
        return []
    labels = cluster(seg.embeddings.numpy(), threshold=cfg.cluster_threshold, weights=seg.weights,
                     num_speakers=num_speakers, min_speakers=min_speakers, max_speakers=max_speakers,
                     min_weight=cfg.min_cluster)
    k_total = max(int(labels.max()) + 1, lo)
    size = seg.probs.shape[1]
    total = torch.zeros(seg.frames, k_total)
    count = torch.zeros(seg.frames, 1)
    speakers = torch.zeros(seg.frames, 1)  # sum over windows of the local speaker count
    by_window: dict[int, list] = {}
    for w, s, a, b, row in seg.pieces:
        by_window.setdefault(w, []).append((s, a, b, int(labels[row])))
    for w, s0 in enumerate(seg.starts):
        local = torch.zeros(size, k_total)
        for s, a, b, k in by_window.get(w, []):  # local speakers sharing a cluster merge by maximum
            local[a:b, k] = torch.maximum(local[a:b, k], seg.probs[w, a:b, s])
        total[s0 : s0 + size] += local
        count[s0 : s0 + size] += 1
        speakers[s0 : s0 + size] += (local > cfg.threshold).sum(1, keepdim=True)  # one per distinct cluster
    glob = total / count.clamp_min(1)  # average over the windows covering each frame
    # how many speakers talk in each frame: the windows' mean count; then that many global speakers, the likeliest
    n_active = (speakers / count.clamp_min(1) + 0.5).floor().clamp(max=k_total).long().squeeze(1)  # T
    rank = glob.argsort(dim=1, descending=True).argsort(dim=1)  # T, K: 0 for the likeliest
    active = ((rank < n_active[:, None]) & (glob > 0)).to(torch.uint8)
    active = median_filter(active, cfg.median)
    return to_turns(active.float(), seg.frame_seconds, seg.uri, threshold=0.5, median=1,
                    labels=[f"spk{k}" for k in range(k_total)])


def diarize_waveform(model, encoder, wave16k: torch.Tensor, uri: str, cfg: PipelineConfig, *,
                     num_speakers: int | None = None, min_speakers: int | None = None,
                     max_speakers: int | None = None, feature_cfg: FeatureConfig = FeatureConfig()) -> list[Turn]:
    """Speaker turns of one mono 16 kHz recording (labels ``spk0``, ``spk1``... by decreasing speech)."""
    check_speaker_counts(num_speakers, min_speakers, max_speakers)
    seg = segment(model, encoder, wave16k, uri, cfg, feature_cfg)
    return stitch(seg, cfg, num_speakers=num_speakers, min_speakers=min_speakers, max_speakers=max_speakers)
