"""Audio input: a path, a waveform ``(channels, samples)``, or pyannote's ``{"waveform", "sample_rate"}``.

Everything becomes one mono float32 signal at the rate asked for (the
pipeline's ``SAMPLE_RATE``; the training data's ``features.FEATURE_RATE``).
Files are read in blocks and mixed down to mono before resampling, so a
1-hour 48 kHz stereo file never holds more than one mono copy at its own
rate in memory. Every input loses its DC offset (``remove_dc``): a constant
or slowly drifting offset, as cheap microphones and sound cards add, is
energy at 0 Hz that the speaker encoder's lowest band reads as voice (an
offset of 0.02 full scale merged the two speakers of pyannote.audio's
sample; one of 0.3 took the dev set's DER from 20.9% to 33.9%), then its
mains hum where it has any (``hum.remove_hum``); ``_finish`` is that one path.

A recording's name (its ``uri``) is its file name without the suffix, each
run of white space made one ``_`` (``recording_uri``): RTTM fields are
separated by spaces, so ``my meeting.wav`` is ``my_meeting`` in its RTTM
and in the output file's name.
"""
from __future__ import annotations

import math
import os
import pathlib
import re
import warnings

import numpy as np
import torch

from ..._checks import BadType, BadValue
from .hum import remove_hum

#: the pipeline's input rate: the speaker encoder's (GE2E) and the VAD's; EEND features are made at
#: ``features.FEATURE_RATE`` from it
SAMPLE_RATE = 16000
BLOCK_SECONDS = 60  # a file is read in blocks of this many seconds
DC_CUTOFF_HZ = 10.0  # remove_dc's high-pass corner: below speech (the model's lowest band starts at 0-55 Hz)


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


def as_field(name: str) -> str:
    """``name`` as one RTTM field (a recording or speaker name): each run of white space one ``_``."""
    return re.sub(r"\s+", "_", name)


def recording_uri(path: str | pathlib.Path) -> str:
    """The recording's name in RTTM and output files: the file name without its suffix, white space as ``_``."""
    stem = pathlib.Path(path).stem  # a file name's bytes that are not UTF-8 (held as surrogates) as U+FFFD
    return as_field("".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in stem))


def remove_dc(mono: np.ndarray, sample_rate: int) -> np.ndarray:
    """``mono`` (1-D float32) without its DC offset, in place: the first block's mean subtracted, then a
    one-pole DC blocker ``y[n] = x[n] - x[n-1] + R y[n-1]`` (corner ``DC_CUTOFF_HZ``) for an offset that drifts,
    run block by block with its state carried (no second copy of a long recording)."""
    from scipy.signal import lfilter

    if mono.size == 0:
        return mono
    block = BLOCK_SECONDS * sample_rate
    mono -= mono[:block].mean(dtype=np.float64)
    r = math.exp(-2.0 * math.pi * DC_CUTOFF_HZ / sample_rate)
    b, a = np.array([1.0, -1.0], np.float32), np.array([1.0, -r], np.float32)
    state = np.zeros(1, np.float32)
    for i in range(0, mono.size, block):
        mono[i : i + block], state = lfilter(b, a, mono[i : i + block], zi=state)
    return mono


#: the lowest sample rate accepted (a file's header or a waveform's ``sample_rate``): below it there is no speech
#: band to hear, and a header saying so is broken
MIN_SAMPLE_RATE = 1000
#: the highest: 768 kHz, the fastest rate audio interfaces record at; beyond it a rate is a typo or a broken header
#: (the hum filter's blocks are seconds long: 1e12 Hz asked for 9 GiB)
MAX_SAMPLE_RATE = 768000


def _finish(mono: np.ndarray, sample_rate: int, target: int) -> torch.Tensor:
    """What every input goes through once it is mono: its DC offset, then its mains hum (where it has any,
    ``hum.remove_hum``) removed in place, then resampled to ``target``."""
    remove_hum(remove_dc(mono, sample_rate), sample_rate, BLOCK_SECONDS * sample_rate)
    return torch.from_numpy(resample(mono, sample_rate, target))


def _wav_header_frames(path: pathlib.Path) -> int | None:
    """The frames a RIFF WAV file's header promises (its data chunk's size over the frame size), or None where
    the file is not a RIFF WAV of samples or the header does not say (libsndfile reads what is there and reports
    that)."""
    import struct

    try:
        with open(path, "rb") as f:
            riff = f.read(12)
            if riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
                return None
            align = tag = None
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return None
                kind, size = head[:4], struct.unpack("<I", head[4:])[0]
                if kind == b"fmt ":
                    fmt = f.read(size)
                    if len(fmt) >= 14:
                        tag, align = struct.unpack("<H", fmt[:2])[0], struct.unpack("<H", fmt[12:14])[0]
                    f.seek(size % 2, 1)  # chunks are padded to an even size
                elif kind == b"data":
                    # frames of a sample format (PCM, float, A-law, mu-law, extensible), not compressed blocks;
                    # a writer to a pipe cannot know the size: 0xFFFFFFFF, or sox's 0x7FFFF000
                    plain = tag in (1, 3, 6, 7, 0xFFFE)
                    return size // align if plain and align and size < 0x7FFFF000 else None
                else:
                    f.seek(size + size % 2, 1)
    except OSError:
        return None


def _read_gsm(path: pathlib.Path) -> np.ndarray:
    """A headerless GSM 6.10 file (8 kHz, as telephone prompt collections ship them): only sox decodes it."""
    import shutil
    import subprocess

    sox = shutil.which("sox")
    if sox is None:
        raise AudioError(f"{path}: reading GSM needs sox (apt-get install sox; in a checkout `make system-deps`)")
    run = subprocess.run([sox, str(path), "-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", "8000",
                          "-"], capture_output=True)
    if run.returncode:
        raise AudioError(f"{path}: cannot read audio ({run.stderr.decode(errors='replace').strip()})")
    return np.frombuffer(run.stdout, dtype="<f4").astype(np.float32)


#: the file kinds a folder of recordings is read for (``diarize evaluate``, ``tune``): what libsndfile reads (WAV,
#: FLAC, Ogg Vorbis and Opus, MP3, AIFF) and headerless GSM through sox; a single file of another kind is tried too
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif", ".gsm")

#: the narrowest audio the models were trained on (telephone band): lower rates are read, with a warning
NARROWEST_RATE = 8000

#: the largest sample magnitude read as audio: full scale is 1.0, or 2^31 where a float file holds the values of
#: 32-bit integer PCM; beyond it the squares behind every level and filterbank overflow float32 (1e20 gave an
#: empty result) and no recording is stored that way
MAX_PEAK = float(2**31)


def _warn_if_narrow(what: str, sr: int) -> None:
    if sr < NARROWEST_RATE:
        warnings.warn(f"{what}: {sr} Hz holds nothing above {sr / 2:g} Hz, and normlab's models heard "
                      f"{NARROWEST_RATE} Hz audio or wider: expect more missed and confused speech", stacklevel=3)


#: the longest recording read, hours: a stream longer than this by its header does not say its length
MAX_HOURS = 48

#: a recording whose loudest sample is below this (-70 dBFS) is too quiet to diarize as it is: the features'
#: power floor flattens it, and pauses read as speech (16-bit samples held in an int32 or int64 array are read as
#: PCM of that width: -96 dBFS and below)
QUIET_PEAK = 10 ** (-70 / 20)


def _check_peak(peak: float, what: str) -> None:
    if peak > MAX_PEAK:
        raise AudioError(f"{what}: samples reach {peak:.3g}, far beyond any audio scale (full scale is 1.0; at most "
                         f"{MAX_PEAK:.3g}, 32-bit integer full scale, is read)")
    if 0 < peak < QUIET_PEAK:
        warnings.warn(f"{what}: its loudest sample is {20 * math.log10(peak):.0f} dBFS, too quiet to diarize as it "
                      "is (pauses read as speech): scale it up (16-bit samples in an int32 or int64 array are read "
                      "as PCM of that width: give them as int16, or as floats in [-1, 1])", stacklevel=3)


#: a mix of a recording's N channels this far (10 dB) below what unrelated channels give, 1/N of their mean
#: energy, means they cancel: one channel's polarity is inverted (a mis-wired microphone, a "wide stereo"
#: effect), and the mono mix holds little of the speech (a phase-inverted copy mixed to silence and read "no
#: speech found"). Channels that do not cancel mix at 1/N of their mean energy where they are unrelated (two
#: voices, twelve tracks of a meeting, each its own talker), above where alike
CANCELLED = 0.1


def _cancelling(mixed: float, each: np.ndarray, what: str) -> int | None:
    """The loudest channel, where the channels cancel when mixed (energies: ``mixed`` of the mix, ``each`` of
    each channel), said in a warning; else None (one channel, silence, or channels that add up)."""
    if len(each) < 2 or not each.max() > 0 or mixed >= CANCELLED * each.mean() / len(each):
        return None
    loudest = int(each.argmax())
    level = -10 * math.log10(mixed / each.mean()) if mixed > 0 else math.inf
    below = "they cancel completely" if level > 200 else f"the mix is {level:.0f} dB below them"
    warnings.warn(f"{what}: its channels cancel when mixed to mono ({below}: one channel's polarity inverted?): "
                  f"diarizing channel {loudest + 1} alone", stacklevel=3)
    return loudest


def _reads_only(f) -> None:
    """Read ``f`` without soundfile's seek to where each read ended (libsndfile's reads move on by themselves):
    where the length is unknown (a FLAC made from a stream) that seek failed at the end, and the audio read was
    thrown away."""
    f.seekable = lambda: False


def _blocks(f, n: int | None):
    """The first ``n`` frames (None: all) of the open ``f`` in blocks of ``BLOCK_SECONDS`` (float32, frames x
    channels), each holding only what was decoded: ``SoundFile.blocks`` handed a cut-short file's last block back
    whole, its buffer's stale tail included (a 150 s MP3 cut to 90 s read as 150 s, its end a copy of earlier
    audio), and refused files libsndfile cannot seek in (GSM 6.10 WAV)."""
    left = math.inf if n is None else n
    while left > 0:
        block = f.read(int(min(BLOCK_SECONDS * f.samplerate, left)), dtype="float32", always_2d=True)
        if not len(block):
            return
        left -= len(block)
        yield block


def read_mono(path: str | pathlib.Path, sample_rate: int) -> torch.Tensor:
    """Mono float32 samples at ``sample_rate`` from a WAV/FLAC/Ogg (or headerless .gsm) file; errors name the file."""
    import soundfile as sf

    if isinstance(path, (str, bytes)) and not path:  # pathlib reads "" as "."
        raise AudioError("an empty path names no audio file")
    path = pathlib.Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: a folder, not an audio file (give its files; diarize evaluate reads a folder)")
    if not os.access(path, os.R_OK):  # libsndfile says only "System error"
        raise AudioError(f"{path}: permission denied (this user cannot read it)")
    if path.is_file() and path.stat().st_size == 0:  # libsndfile says "Format not recognised"
        raise AudioError(f"{path}: an empty file (0 bytes), not audio")
    if path.suffix.lower() == ".gsm":
        mono = _read_gsm(path)
        if mono.size == 0:
            raise EmptyAudio(f"{path}: no audio samples")
        return _finish(mono, 8000, sample_rate)
    finite, peak = True, 0.0
    regular = path.is_file()  # not a pipe: its header's length can be trusted, and it can be opened again
    try:
        with sf.SoundFile(os.fsencode(path)) as f:  # bytes: a name that is not UTF-8 opens too
            sr, n = f.samplerate, f.frames
            if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
                raise AudioError(f"{path}: its header gives {sr} Hz; {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz "
                                 "are read")
            _warn_if_narrow(str(path), sr)
            # a stream from a pipe need not say its length (libsndfile gives its largest count, or what a writer
            # put in the header before it knew): its blocks are gathered as they come, kept whole where it has
            # channels that may cancel (it cannot be read again for one of them)
            known = regular and n <= sr * MAX_HOURS * 3600
            if not known:
                _reads_only(f)
            mono = np.empty(n if known else 0, dtype=np.float32)
            parts, blocks = [], []
            pos, mixed, each = 0, 0.0, np.zeros(f.channels)  # energies: of the mix, of each channel
            for block in _blocks(f, n if known else None):
                if known:
                    part = mono[pos : pos + block.shape[0]]
                    part[:] = block.mean(axis=1)
                else:
                    part = block.mean(axis=1, dtype=np.float32)
                    parts.append(part)
                    if f.channels > 1:
                        blocks.append(block)
                finite = finite and bool(np.isfinite(part).all())
                peak = max(peak, float(np.abs(block).max(initial=0.0)))
                if finite:
                    mixed += float(np.dot(part, part))
                    each += np.einsum("tc,tc->c", block, block, dtype=np.float64)
                pos += block.shape[0]
            mono = mono[:pos] if known else (np.concatenate(parts) if parts else mono)
            channel = _cancelling(mixed, each, str(path))
        if channel is not None and finite and not regular:  # that channel alone, from the blocks kept
            mono = np.concatenate([b[:, channel] for b in blocks]).astype(np.float32)
        elif channel is not None and finite:  # read again, that channel alone (opened again: some files cannot
            with sf.SoundFile(os.fsencode(path)) as f:  # seek)
                if not known:
                    _reads_only(f)
                at = 0
                for block in _blocks(f, pos):
                    mono[at : at + block.shape[0]] = block[:, channel]
                    at += block.shape[0]
        told = (_wav_header_frames(path) or n) if known else 0
        if 0 < pos < told:  # a copy cut short: diarized as what it holds, said once
            places = next(k for k in (1, 2, 3, 6) if f"{told / sr:.{k}f}" != f"{pos / sr:.{k}f}" or k == 6)
            warnings.warn(f"{path}: its header gives {told / sr:.{places}f} s, the file holds {pos / sr:.{places}f} "
                          "s (cut short?): diarizing what it holds", stacklevel=2)
    except AudioError:
        raise
    except Exception as e:  # noqa: BLE001 - libsndfile raises several types
        detail = str(e)  # the path is said once: libsndfile names it as opened (bytes) or as given
        for named in (repr(os.fsencode(path)), repr(str(path))):
            detail = detail.replace(f" {named}", "")
        detail = detail.replace(str(path), "the file")
        if not regular and "flac" in detail.lower():  # libsndfile's FLAC decoder seeks: from a pipe it loses sync
            detail += "; FLAC cannot be read from a pipe: give the file, or pipe WAV or Ogg"
        raise AudioError(f"{path}: cannot read audio ({detail})") from None
    if mono.size == 0:
        raise EmptyAudio(f"{path}: no audio samples")
    if not finite:  # a floating-point file can hold them; every later stage would turn them into silence
        raise AudioError(f"{path}: holds NaN or infinite samples")
    _check_peak(peak, str(path))
    return _finish(mono, sr, sample_rate)


def as_mono(audio, sample_rate: int | None, target: int) -> tuple[torch.Tensor, str]:
    """``(samples at target rate, uri)`` for any accepted input; ValueError/TypeError with one line otherwise.

    Accepted: a file path (str or any os.PathLike; ``sample_rate`` must be None); a numpy
    array or torch tensor ``(channels, samples)`` or ``(samples,)`` with
    ``sample_rate``; a dict ``{"waveform": (channels, samples), "sample_rate": int}``
    (an optional ``"uri"`` names the recording).
    """
    uri = "audio"
    if isinstance(audio, (str, os.PathLike)):
        if sample_rate is not None:
            raise BadValue("sample_rate is read from the file; pass it only with a waveform")
        return read_mono(audio, target), recording_uri(audio)
    if isinstance(audio, dict):
        if "waveform" not in audio or "sample_rate" not in audio:
            raise BadValue(f"an audio dict needs 'waveform' and 'sample_rate' keys, got {sorted(audio)}")
        if sample_rate is not None and sample_rate != audio["sample_rate"]:
            raise BadValue(f"sample_rate={sample_rate} contradicts the dict's {audio['sample_rate']}")
        if audio.get("uri") is not None:  # (None: unnamed, as without the key)
            named = audio["uri"]
            if not isinstance(named, str) or not as_field(named):
                raise BadValue(f"the audio dict's 'uri' must be a non-empty string, got {named!r}")
            uri = as_field(named)
        audio, sample_rate = audio["waveform"], audio["sample_rate"]
    if isinstance(audio, torch.Tensor):
        if audio.layout != torch.strided or audio.is_meta:  # (a raw TypeError or NotImplementedError at .numpy())
            raise BadType(f"waveform must be a dense tensor holding its samples, got a {audio.layout} tensor on "
                          f"{audio.device}")
        audio = audio.detach().cpu()
        # numpy has neither bfloat16 nor float8: narrower floating-point tensors are widened (exactly) first
        audio = (audio.float() if audio.is_floating_point() and audio.dtype not in (torch.float32, torch.float64)
                 else audio).numpy()
    if not isinstance(audio, np.ndarray):
        raise BadType(f"audio must be a path, a numpy array, a torch tensor or a dict, got {type(audio).__name__}")
    audio = np.asarray(audio)  # a np.matrix multiplies as a matrix (its energies failed to align)
    if audio.dtype.kind == "f" and audio.dtype.itemsize > 8:  # long double: einsum and torch take at most float64
        audio = audio.astype(np.float64)
    if sample_rate is None:
        raise BadValue("sample_rate is required with a waveform")
    if not isinstance(sample_rate, (int, np.integer)) or not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise BadValue(f"sample_rate must be an integer from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz, got "
                       f"{sample_rate!r}")
    if audio.dtype.kind != "f":
        if audio.dtype.kind in "iu":  # PCM: full scale is 2^(bits-1); unsigned PCM is centred (a timedelta is
            #                           an integer to np.issubdtype, and iinfo refused it)
            info = np.iinfo(audio.dtype)
            half = (int(info.max) + 1) // 2 if info.min == 0 else -int(info.min)
            audio = (audio.astype(np.float32) - (half if info.min == 0 else 0)) / half
        else:
            raise BadType(f"waveform must hold real numbers, got dtype {audio.dtype}")
    if audio.ndim == 1:
        audio = audio[None]
    if audio.ndim != 2:
        raise BadValue(f"waveform must be (channels, samples) or (samples,), got shape {list(audio.shape)}")
    if audio.shape[1] == 0 or audio.shape[0] == 0:
        raise BadValue(f"waveform has no {'samples' if audio.shape[0] else 'channels'} (shape {list(audio.shape)})")
    if audio.shape[0] > audio.shape[1]:
        raise BadValue(f"waveform shape {list(audio.shape)} looks like (samples, channels); pass (channels, samples)")
    if not np.isfinite(audio).all():
        raise BadValue("waveform contains NaN or Inf")
    _check_peak(float(np.abs(audio).max()), "waveform")
    _warn_if_narrow(f"a waveform of {uri!r}" if uri != "audio" else "the waveform", int(sample_rate))
    mono = audio.astype(np.float32, copy=False).mean(axis=0)  # a new array: the caller's is left as it was
    channel = _cancelling(float(np.dot(mono, mono)), np.einsum("ct,ct->c", audio, audio, dtype=np.float64),
                          "the waveform" if uri == "audio" else f"the waveform of {uri!r}")
    if channel is not None:
        mono = audio[channel].astype(np.float32)  # (a copy: the caller's array is left as it was)
    return _finish(mono, int(sample_rate), target), uri
