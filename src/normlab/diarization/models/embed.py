"""Speaker embeddings: the GE2E speaker encoder (Wan et al. 2018) with Resemblyzer 0.1.4's trained weights.

The network is normlab's own code with the published architecture: a power
mel spectrogram (16 kHz, 25 ms Hann window every 10 ms, FFT 400, 40 Slaney
mel bands, not log), a 3-layer LSTM with 256 units, a linear layer, ReLU and
L2 normalization of the last hidden state. Only the weights come from
Resemblyzer (``resemblyzer==0.1.4``'s ``pretrained.pt``, Apache-2.0; trained on
LibriSpeech, VoxCeleb 1 and 2): its model state, converted once to
``assets/ge2e.safetensors`` (``models/convert_weights.py``), ships in normlab
beside its licence (``assets/ge2e.LICENSE``) and notice (``assets/ge2e.NOTICE``).

An embedding of a set of frames (one speaker's speech inside a window) is the
L2-normalized mean of the embeddings of 1.6 s partials, as Resemblyzer's
``embed_utterance``; the audio is scaled to -30 dBFS first (only louder).
"""
from __future__ import annotations

import functools
import math
import pathlib

import numpy as np
import torch
from torch import nn

from ..._checks import BadValue
from ...nn.constants import DeviceConstant
from ..io.audio import SAMPLE_RATE
from .weights import MissingAssetError, asset, is_safetensors, load_weights, read_weights, write_safetensors

N_FFT, HOP, N_MELS = 400, 160, 40  # 25 ms window, 10 ms step
PARTIAL = 160  # frames per partial utterance (1.6 s)
EMBED_DIM = 256  # the embedding's size
WEIGHTS_FILE = "ge2e.safetensors"  # in assets/: Resemblyzer 0.1.4's model state (lstm.*, linear.*)
_KEPT = ("lstm.", "linear.")  # the network's tensors; Resemblyzer's similarity scale and optimizer are not kept


class MissingWeightsError(MissingAssetError):
    """The speaker encoder's weight file is missing from the installation."""


def slaney_mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Triangular filters on the Slaney mel scale with Slaney area normalization, ``(n_mels, n_fft // 2 + 1)``.

    Linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4);
    the same filters as ``librosa.filters.mel(htk=False, norm="slaney")``.
    """
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp

    def to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

    def to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft_freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_f = to_hz(np.linspace(to_mel(0.0), to_mel(sample_rate / 2), n_mels + 2))  # n_mels+2 edges in Hz
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]  # n_mels+2, F
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))  # n_mels, F
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]  # equal area per filter
    return torch.from_numpy(weights.astype(np.float32))


class MelFrontend(nn.Module):
    """``wave (samples,) at 16 kHz -> power mel (frames, 40)``, one frame per 10 ms, centred (zero padded)."""

    def __init__(self):
        super().__init__()
        # constants made where they are used, not buffers (DeviceConstant says why)
        self._window = DeviceConstant(functools.partial(torch.hann_window, N_FFT, periodic=True))
        self._fbank = DeviceConstant(slaney_mel_filterbank)

    def constants(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Hann window ``(N_FFT,)`` and the mel filterbank ``(40, F)`` on ``like``'s device, in its dtype."""
        return self._window(like.device, like.dtype), self._fbank(like.device, like.dtype)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        window, fbank = self.constants(wave)
        spec = torch.stft(wave, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=True,
                          pad_mode="constant", return_complex=True)  # F, frames
        return (spec.abs().pow(2).T @ fbank.T).float()  # frames, n_mels


def weights_path() -> pathlib.Path:
    """The shipped weights, ``assets/ge2e.safetensors``."""
    return asset(WEIGHTS_FILE, MissingWeightsError)


class SpeakerEncoder(nn.Module):
    """GE2E speaker encoder: ``mel (batch, frames, 40) -> embedding (batch, 256)``, L2-normalized, >= 0.

    Shape: frames may differ per sequence (``lengths``); the embedding is read
    from the last layer's hidden state at each sequence's last frame.
    """

    def __init__(self, hidden: int = 256, layers: int = 3, dim: int = EMBED_DIM):
        super().__init__()
        self.frontend = MelFrontend()
        self.lstm = nn.LSTM(N_MELS, hidden, layers, batch_first=True)
        self.linear = nn.Linear(hidden, dim)
        self.relu = nn.ReLU()

    def forward(self, mels: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if lengths is None:
            _, (h, _) = self.lstm(mels)
        else:
            packed = nn.utils.rnn.pack_padded_sequence(mels, lengths.cpu(), batch_first=True, enforce_sorted=False)
            _, (h, _) = self.lstm(packed)
        raw = self.relu(self.linear(h[-1]))  # B, dim
        return raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)

    @classmethod
    def load(cls, path: str | pathlib.Path | None = None) -> "SpeakerEncoder":
        """The encoder with the shipped weights (``path=None``), or those of a ``.safetensors`` file written by
        ``save``, or of Resemblyzer's own ``pretrained.pt`` (``{"model_state": ...}``, read as plain tensors)."""
        path = weights_path() if path is None else pathlib.Path(path)
        if not path.is_file():
            raise MissingWeightsError(f"no speaker encoder weights at {path}")
        not_ours = f"{path} is not a GE2E speaker encoder checkpoint"
        if is_safetensors(path):
            state = read_weights(path, not_ours)
        else:
            try:
                blob = torch.load(path, map_location="cpu", weights_only=True)
            except Exception:  # noqa: BLE001 - another file format
                raise BadValue(f"{not_ours}: neither safetensors nor a torch file (truncated, or another kind)") \
                    from None
            if isinstance(blob, dict) and {"config", "state_dict"} <= blob.keys():
                raise BadValue(f"{not_ours}: it is an EEND segmentation model (give it with --model)")
            if not isinstance(blob, dict) or not isinstance(blob.get("model_state"), dict):
                raise BadValue(f"{not_ours}: a torch file without the encoder's model_state")
            state = blob["model_state"]
        return load_weights(cls(), {k: v for k, v in state.items() if k.startswith(_KEPT)}, not_ours)

    def save(self, path: str | pathlib.Path, metadata: dict[str, str] | None = None) -> None:
        """Write the network's tensors as safetensors (what ``load`` reads), with ``metadata`` in the header."""
        write_safetensors(path, {k: v for k, v in self.state_dict().items() if k.startswith(_KEPT)}, metadata)

    @staticmethod
    def normalize_volume(wave: torch.Tensor, target_dbfs: float = -30.0) -> torch.Tensor:
        """Scale up to ``target_dbfs`` RMS (never down), as Resemblyzer's preprocessing."""
        rms = wave.pow(2).mean().sqrt().item() if wave.numel() else 0.0
        if rms <= 0:
            return wave
        gain = 10 ** ((target_dbfs - 20 * math.log10(rms)) / 20)
        return wave * gain if gain > 1 else wave

    name = "ge2e"

    @property
    def dim(self) -> int:
        return self.linear.out_features

    def features(self, wave16k: torch.Tensor, block: int = 6000) -> torch.Tensor:
        """:meth:`mel` of a whole recording ``(1 + len // 160, 40)``, in blocks of ``block`` frames (bounded
        memory), for :meth:`embed_frames` (the pipeline's speaker-encoder interface, as
        ``CAMPlusEncoder.features``)."""
        wave = self.normalize_volume(wave16k)
        padded = torch.nn.functional.pad(wave, (N_FFT // 2, N_FFT // 2))  # centred frames, zero padding
        frames = 1 + wave.numel() // HOP
        window, fbank = self.frontend.constants(wave)
        parts = []
        for a in range(0, frames, block):
            b = min(frames, a + block)
            seg = padded[a * HOP : (b - 1) * HOP + N_FFT]
            spec = torch.stft(seg, N_FFT, hop_length=HOP, window=window, center=False, return_complex=True)  # F, b-a
            parts.append(spec.abs().pow(2).T @ fbank.T)
        return torch.cat(parts).float()

    def mel(self, wave: torch.Tensor) -> torch.Tensor:
        """Power mel ``(frames, 40)`` of 16 kHz samples after volume normalization; frame i centred at i * 10 ms."""
        return self.frontend(self.normalize_volume(wave))

    @torch.no_grad()
    def embed_frames(self, mel: torch.Tensor, groups: list[torch.Tensor], min_frames: int = 50) -> torch.Tensor:
        """One embedding per group of mel frame indices: ``(len(groups), dim)``; NaN rows for groups that are too short.

        A group's frames (not necessarily contiguous: one speaker's speech in a
        window) are concatenated and cut into 1.6 s partials; a rest of
        ``min_frames`` or more adds the group's last 1.6 s as one more partial;
        a group shorter than 1.6 s is one partial. The group's embedding is the normalized mean of its partials'.
        """
        full, full_owner, short, short_owner = [], [], [], []
        for g, idx in enumerate(groups):
            n = int(idx.numel())
            if n < min_frames:
                continue
            frames = mel[idx]  # n, 40
            if n < PARTIAL:
                short.append(frames)
                short_owner.append(g)
                continue
            starts = list(range(0, n - PARTIAL + 1, PARTIAL))
            if n - (starts[-1] + PARTIAL) >= min_frames:
                starts.append(n - PARTIAL)  # the rest, as the last 1.6 s
            full += [frames[s : s + PARTIAL] for s in starts]
            full_owner += [g] * len(starts)
        out = torch.full((len(groups), self.linear.out_features), float("nan"))
        if not full and not short:
            return out
        embs = []
        if full:  # all 1.6 s: one plain batched LSTM (much faster on CPU than packed sequences)
            batch = torch.stack(full)  # P, 160, 40
            embs += [self(batch[i : i + 256]) for i in range(0, len(full), 256)]
        if short:
            lengths = torch.tensor([x.shape[0] for x in short])
            padded = nn.utils.rnn.pad_sequence(short, batch_first=True)
            embs += [self(padded[i : i + 256], lengths[i : i + 256]) for i in range(0, len(short), 256)]
        emb = torch.cat(embs)
        owner = full_owner + short_owner
        owner_t = torch.tensor(owner)
        for g in owner_t.unique().tolist():
            m = emb[owner_t == g].mean(0)
            out[g] = m / m.norm().clamp_min(1e-12)
        return out
