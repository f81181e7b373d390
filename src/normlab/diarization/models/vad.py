"""Speech activity: Silero VAD (v6, 16 kHz) with the weights of ``silero-vad==6.2.3``, as a normlab module.

The network is written here from its published structure: a fixed STFT as a
1-D convolution (FFT 256, hop 128) on each 32 ms chunk (512 samples, with the
previous 64 samples as context and 64 reflected samples after it), magnitude,
four 1-D convolutions with ReLU (the last three frames stride down to one),
an LSTM cell carried across chunks, ReLU, a 1x1 convolution and a sigmoid:
one speech probability per 32 ms. Only the weights come from Silero VAD
(``silero-vad==6.2.3``, MIT licence): the 16 kHz tensors of its ``silero_vad.jit``,
converted once to ``assets/silero_vad.safetensors`` (``models/convert_weights.py``)
and shipped in normlab beside their licence (``assets/silero_vad.LICENSE``); none
of the package's code is used.

The chunks are independent up to the LSTM, so the front end runs batched over
a whole recording (in blocks, bounded memory) and the recurrence is one
``nn.LSTM`` call per block with the state carried: the same numbers as the
package's chunk-by-chunk loop (tested against its TorchScript model when it is
installed), much faster.
"""
from __future__ import annotations

import functools
import pathlib
import warnings

import torch
from torch import nn

from ..io.audio import SAMPLE_RATE
from .weights import MissingAssetError, asset, is_safetensors, read_safetensors, write_safetensors

CHUNK, CONTEXT = 512, 64  # 32 ms per probability; samples of the previous chunk seen by the next
N_FFT, HOP = 256, 128
WEIGHTS_FILE = "silero_vad.safetensors"  # in assets/, this module's names
ARCHIVE = "silero_vad/data/silero_vad.jit"  # the package's TorchScript archive the shipped tensors come from
# the archive's names -> this module's
_KEYS = {"stft.forward_basis_buffer": "stft_conv.weight", "decoder.rnn.weight_ih": "lstm.weight_ih_l0",
         "decoder.rnn.weight_hh": "lstm.weight_hh_l0", "decoder.rnn.bias_ih": "lstm.bias_ih_l0",
         "decoder.rnn.bias_hh": "lstm.bias_hh_l0", "decoder.decoder.2.weight": "final_conv.weight",
         "decoder.decoder.2.bias": "final_conv.bias",
         **{f"encoder.{i}.reparam_conv.{p}": f"conv{i + 1}.{p}" for i in range(4) for p in ("weight", "bias")}}


class MissingVADWeightsError(MissingAssetError):
    """The VAD's weight file is missing from the installation."""


def installed_weights() -> pathlib.Path:
    """The shipped weights, ``assets/silero_vad.safetensors``."""
    return asset(WEIGHTS_FILE, MissingVADWeightsError)


class SileroVAD(nn.Module):
    """Speech probability per 32 ms of 16 kHz mono audio."""

    def __init__(self):
        super().__init__()
        self.stft_conv = nn.Conv1d(1, 2 * (N_FFT // 2 + 1), N_FFT, stride=HOP, bias=False)
        self.conv1 = nn.Conv1d(N_FFT // 2 + 1, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, 128, 3, padding=1)
        self.lstm = nn.LSTM(128, 128, batch_first=True)
        self.final_conv = nn.Conv1d(128, 1, 1)

    @classmethod
    def load(cls, path: str | pathlib.Path | None = None) -> "SileroVAD":
        """The network with the shipped weights (``path=None``), those of a ``.safetensors`` file written by
        ``save``, or the 16 kHz tensors of the package's TorchScript archive (``silero_vad.jit``; its code is
        never run)."""
        path = pathlib.Path(path) if path is not None else installed_weights()
        if is_safetensors(path):
            sd = read_safetensors(path)[0]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                archive = torch.jit.load(str(path), map_location="cpu")
            sd = {_KEYS[k]: v.detach().clone() for k, v in archive._model.state_dict().items() if k in _KEYS}
        m = cls()
        m.load_state_dict(sd)
        return m.eval()

    def save(self, path: str | pathlib.Path, metadata: dict[str, str] | None = None) -> None:
        """Write the weights as safetensors (what ``load`` reads), with ``metadata`` in the header."""
        write_safetensors(path, self.state_dict(), metadata)

    def frontend(self, chunks: torch.Tensor) -> torch.Tensor:
        """``(n, CONTEXT + CHUNK)`` samples -> ``(n, 128)`` features, one per chunk."""
        x = nn.functional.pad(chunks, (0, CONTEXT), mode="reflect").unsqueeze(1)  # n, 1, 640
        x = self.stft_conv(x)  # n, 258, 4
        half = N_FFT // 2 + 1
        x = (x[:, :half] ** 2 + x[:, half:] ** 2).sqrt()
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = torch.relu(conv(x))
        return x.squeeze(-1)  # n, 128

    @torch.no_grad()
    def forward(self, wave16k: torch.Tensor, block: int = 4096) -> torch.Tensor:
        """Speech probabilities ``(ceil(samples / 512),)`` of a mono 16 kHz waveform ``(samples,)``."""
        wave = wave16k.float().reshape(-1)
        n = -(-wave.numel() // CHUNK)
        if n == 0:
            return torch.zeros(0)
        wave = nn.functional.pad(wave, (CONTEXT, n * CHUNK - wave.numel()))
        chunks = wave.unfold(0, CONTEXT + CHUNK, CHUNK)  # n, 576 (a view)
        out, state = [], None
        for a in range(0, n, block):
            h, state = self.lstm(self.frontend(chunks[a : a + block]).unsqueeze(0), state)  # 1, b, 128
            out.append(torch.sigmoid(self.final_conv(torch.relu(h).transpose(1, 2))).reshape(-1))
        return torch.cat(out)


@functools.lru_cache(maxsize=1)
def default_vad() -> SileroVAD:
    """The VAD with the installed weights, loaded once per process."""
    return SileroVAD.load()


def speech_probability(vad: SileroVAD, wave16k: torch.Tensor, frames: int, frame_seconds: float) -> torch.Tensor:
    """The VAD's speech probability averaged onto ``frames`` frames of ``frame_seconds`` ``(frames,)``.

    Each frame gets the mean of the 32 ms probabilities it overlaps, weighted by the overlap's length.
    """
    p = vad(wave16k)  # one per 32 ms chunk
    if p.numel() == 0:
        return torch.zeros(frames)
    dt = CHUNK / SAMPLE_RATE
    cum = torch.cat([torch.zeros(1), torch.cumsum(p * dt, 0)])  # integral of p up to each chunk edge

    def integral(x):  # integral of the step function p from 0 to x
        x = x.clamp(0, p.numel() * dt)
        i = (x / dt).floor().long().clamp(max=p.numel() - 1)
        return cum[i] + p[i] * (x - i * dt)

    centres = (torch.arange(frames) + 0.5) * frame_seconds
    lo, hi = (centres - frame_seconds / 2).clamp_min(0), centres + frame_seconds / 2
    return ((integral(hi) - integral(lo)) / (hi - lo).clamp_min(1e-9)).clamp(0, 1)
