"""Audio input: a path, a waveform ``(channels, samples)``, or pyannote's ``{"waveform", "sample_rate"}``.

Everything becomes one mono float32 signal at the rate asked for (the
pipeline's ``SAMPLE_RATE``; the training data's ``features.FEATURE_RATE``).
Files are read in blocks and mixed down to mono before resampling, so a
1-hour 48 kHz stereo file never holds more than one mono copy at its own
rate in memory.
"""
from __future__ import annotations

import math
import pathlib

import numpy as np
import torch

from ..._checks import BadType, BadValue

#: the pipeline's input rate: the speaker encoder's (GE2E) and the VAD's; EEND features are made at
#: ``features.FEATURE_RATE`` from it
SAMPLE_RATE = 16000
BLOCK_SECONDS = 60  # a file is read in blocks of this many seconds


class AudioError(BadValue):
    """An audio file that cannot be used; the message names the file."""


class EmptyAudio(AudioError):
    """A readable audio file that holds no samples (a header alone)."""


def resample(mono: np.ndarray, orig: int, target: int) -> np.ndarray:
    """Polyphase resampling (scipy's ``resample_poly``) of a 1-D float32 signal."""
    if orig == target:
        return np.ascontiguousarray(mono, dtype=np.float32)
    from scipy.signal import resample_poly

    g = math.gcd(orig, target)
    return resample_poly(mono, target // g, orig // g).astype(np.float32)


def _read_gsm(path: pathlib.Path) -> np.ndarray:
    """A headerless GSM 6.10 file (8 kHz, as telephone prompt collections ship them): only sox decodes it."""
    import shutil
    import subprocess

    sox = shutil.which("sox")
    if sox is None:
        raise AudioError(f"{path}: reading GSM needs sox (Debian package sox; `make system-deps` installs it)")
    run = subprocess.run([sox, str(path), "-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", "8000",
                          "-"], capture_output=True)
    if run.returncode:
        raise AudioError(f"{path}: cannot read audio ({run.stderr.decode(errors='replace').strip()})")
    return np.frombuffer(run.stdout, dtype="<f4").astype(np.float32)


def read_mono(path: str | pathlib.Path, sample_rate: int) -> torch.Tensor:
    """Mono float32 samples at ``sample_rate`` from a WAV/FLAC/Ogg (or headerless .gsm) file; errors name the file."""
    import soundfile as sf

    path = pathlib.Path(path)
    if path.suffix.lower() == ".gsm":
        mono = _read_gsm(path)
        if mono.size == 0:
            raise EmptyAudio(f"{path}: no audio samples")
        return torch.from_numpy(resample(mono, 8000, sample_rate))
    try:
        with sf.SoundFile(str(path)) as f:
            sr, n = f.samplerate, f.frames
            mono = np.empty(n, dtype=np.float32)
            pos = 0
            for block in f.blocks(blocksize=BLOCK_SECONDS * sr, dtype="float32", always_2d=True):
                mono[pos : pos + block.shape[0]] = block.mean(axis=1)
                pos += block.shape[0]
            mono = mono[:pos]
    except Exception as e:  # noqa: BLE001 - libsndfile raises several types
        raise AudioError(f"{path}: cannot read audio ({e})") from None
    if mono.size == 0:
        raise EmptyAudio(f"{path}: no audio samples")
    return torch.from_numpy(resample(mono, sr, sample_rate))


def as_mono(audio, sample_rate: int | None, target: int) -> tuple[torch.Tensor, str]:
    """``(samples at target rate, uri)`` for any accepted input; ValueError/TypeError with one line otherwise.

    Accepted: a file path (str or Path; ``sample_rate`` must be None); a numpy
    array or torch tensor ``(channels, samples)`` or ``(samples,)`` with
    ``sample_rate``; a dict ``{"waveform": (channels, samples), "sample_rate": int}``
    (an optional ``"uri"`` names the recording).
    """
    uri = "audio"
    if isinstance(audio, (str, pathlib.Path)):
        if sample_rate is not None:
            raise BadValue("sample_rate is read from the file; pass it only with a waveform")
        return read_mono(audio, target), pathlib.Path(audio).stem
    if isinstance(audio, dict):
        if "waveform" not in audio or "sample_rate" not in audio:
            raise BadValue(f"an audio dict needs 'waveform' and 'sample_rate' keys, got {sorted(audio)}")
        if sample_rate is not None and sample_rate != audio["sample_rate"]:
            raise BadValue(f"sample_rate={sample_rate} contradicts the dict's {audio['sample_rate']}")
        uri = str(audio.get("uri", uri))
        audio, sample_rate = audio["waveform"], audio["sample_rate"]
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray):
        raise BadType(f"audio must be a path, a numpy array, a torch tensor or a dict, got {type(audio).__name__}")
    if sample_rate is None:
        raise BadValue("sample_rate is required with a waveform")
    if not isinstance(sample_rate, (int, np.integer)) or sample_rate < 1000:
        raise BadValue(f"sample_rate must be an integer >= 1000 Hz, got {sample_rate!r}")
    if not np.issubdtype(audio.dtype, np.floating):
        if np.issubdtype(audio.dtype, np.integer):
            audio = audio.astype(np.float32) / np.iinfo(audio.dtype).max
        else:
            raise BadType(f"waveform must hold real numbers, got dtype {audio.dtype}")
    if audio.ndim == 1:
        audio = audio[None]
    if audio.ndim != 2:
        raise BadValue(f"waveform must be (channels, samples) or (samples,), got shape {list(audio.shape)}")
    if audio.shape[0] > audio.shape[1]:
        raise BadValue(f"waveform shape {list(audio.shape)} looks like (samples, channels); pass (channels, samples)")
    if audio.shape[1] == 0:
        raise BadValue("waveform has no samples")
    if not np.isfinite(audio).all():
        raise BadValue("waveform contains NaN or Inf")
    mono = audio.astype(np.float32, copy=False).mean(axis=0)
    return torch.from_numpy(resample(mono, int(sample_rate), target)), uri
