"""Simulated conversations without downloads (EEND's recipe, Fujita et al. 2019).

Speakers are espeak-ng voice variants with a pitch and a speed; the train,
dev and test splits use disjoint variants (positions in espeak-ng's sorted
variant list: even for train, 1 mod 4 for dev, 3 mod 4 for test), so dev
and test voices are never heard in training. The ``flite`` split uses
another synthesizer altogether (flite's four English speakers): a held-out
set further from the training data than ``test``. Per speaker, ``utterances`` utterances of random words, each preceded
by silence ~ Exponential(beta) seconds; the speaker tracks are summed and
white noise is added at an SNR drawn from ``snr_db``. With ``rt60`` set,
each speaker's track is first convolved with its own synthetic room impulse
response (a direct path plus exponentially decaying noise reaching -60 dB at
a reverberation time drawn from ``rt60``). Each mixture is seeded by (seed,
split, index), written as ``wav/<uri>.wav`` with ``ref.rttm`` and
``all.uem``; existing mixtures are kept (re-running resumes).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import pathlib
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass

import numpy as np

from .features import load_audio
from .rttm import Turn, read_rttm, write_rttm, write_uem

WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()


@dataclass(frozen=True)
class SimConfig:
    n_mixtures: int = 100
    n_speakers: int = 2
    beta: float = 2.0  # mean silence before each utterance, seconds (smaller: more overlap)
    min_utterances: int = 5
    max_utterances: int = 20
    snr_db: tuple[float, float] = (10.0, 20.0)
    sample_rate: int = 8000
    split: str = "train"  # "train", "dev" or "test": disjoint voice variants
    seed: int = 0
    rt60: tuple[float, float] | None = None  # reverberation time range, seconds (None: dry)


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise RuntimeError(f"{name} is not installed (Debian package {name}; `make test` or `make demo` installs it)")
    return exe


#: espeak-ng splits by position in its sorted variant list; "flite" is a held-out synthesizer
SPLITS = ("train", "dev", "test", "flite")
FLITE_VOICES = ("awb", "kal16", "rms", "slt")  # flite's full-domain English speakers (kal is kal16 at 8 kHz)


def variants(split: str) -> list[str]:
    """Voices of a split: espeak-ng variants at even positions for train, 1 mod 4 for dev, 3 mod 4 for test;
    flite's voices for ``flite``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "flite":
        _tool("flite")
        return list(FLITE_VOICES)
    out = subprocess.run([_tool("espeak-ng"), "--voices=variant"], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[3] for line in out.splitlines()[1:] if len(line.split()) >= 4)
    return {"train": names[0::2], "dev": names[1::4], "test": names[3::4]}[split]


def _command(text: str, voice: str, pitch: int, speed: int, wav: pathlib.Path) -> list[str]:
    """The synthesizer call: espeak-ng with a variant, or flite with a voice; pitch 0-99, speed in words/min."""
    if voice in FLITE_VOICES:
        f0, stretch = 80 + 1.6 * pitch, 160 / speed  # pitch 20-80 -> 112-208 Hz mean F0
        return [_tool("flite"), "-voice", voice, "--setf", f"int_f0_target_mean={f0:.0f}",
                "--setf", f"duration_stretch={stretch:.3f}", "-t", text, "-o", str(wav)]
    return [_tool("espeak-ng"), "-v", f"en+{voice}", "-p", str(pitch), "-s", str(speed), "-w", str(wav), text]


def synthesize(text: str, voice: str, pitch: int, speed: int, sample_rate: int) -> np.ndarray:
    """One utterance as float32 samples at ``sample_rate``."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = pathlib.Path(tmp) / "u.wav"
        subprocess.run(_command(text, voice, pitch, speed, wav), check=True, capture_output=True)
        speech = load_audio(wav, sample_rate).numpy()
    voiced = np.flatnonzero(np.abs(speech) > 1e-3)  # trim leading/trailing silence: turns are speech
    return speech[voiced[0] : voiced[-1] + 1] if voiced.size else speech


def room_impulse_response(rt60: float, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """A direct path then Gaussian noise decaying by 60 dB over ``rt60`` seconds; unit energy."""
    if rt60 <= 0:
        raise ValueError(f"rt60 must be > 0 seconds, got {rt60}")
    t = np.arange(int(rt60 * sample_rate)) / sample_rate
    h = rng.standard_normal(t.size) * 10 ** (-3 * t / rt60) * 0.3  # amplitude -60 dB at t = rt60
    h[0] = 1.0
    return (h / np.sqrt(np.sum(h**2))).astype(np.float32)


def reverberate(track: np.ndarray, rt60: float, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """``track`` in a room: convolved with a fresh impulse response, cut to its own length (turns stay put)."""
    from scipy.signal import fftconvolve

    return fftconvolve(track, room_impulse_response(rt60, sample_rate, rng))[: len(track)].astype(np.float32)


def mixture(cfg: SimConfig, index: int, voices: list[str]) -> tuple[np.ndarray, list[Turn], str]:
    """Mixture ``index``: samples, reference turns and its uri."""
    rng = np.random.default_rng([cfg.seed, index, SPLITS.index(cfg.split)])
    uri = mixture_uri(cfg, index)
    picks = rng.choice(len(voices), size=cfg.n_speakers, replace=False)
    tracks, turns = [], []
    for k, v in enumerate(picks):
        pitch, speed = int(rng.integers(20, 80)), int(rng.integers(130, 190))
        pieces, t = [], 0.0
        for _ in range(int(rng.integers(cfg.min_utterances, cfg.max_utterances + 1))):
            silence = rng.exponential(cfg.beta)
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))
            speech = synthesize(words, voices[v], pitch, speed, cfg.sample_rate)
            pieces += [np.zeros(int(silence * cfg.sample_rate), np.float32), speech]
            start = t + int(silence * cfg.sample_rate) / cfg.sample_rate
            turns.append(Turn(uri, round(start, 3), round(len(speech) / cfg.sample_rate, 3), f"{voices[v]}_{pitch}"))
            t = start + len(speech) / cfg.sample_rate
        tracks.append(np.concatenate(pieces))
    if cfg.rt60 is not None:
        tracks = [reverberate(x, rng.uniform(*cfg.rt60), cfg.sample_rate, rng) for x in tracks]
    n = max(len(x) for x in tracks)
    mix = np.zeros(n, np.float32)
    for x in tracks:
        mix[: len(x)] += x
    power = float(np.mean(mix**2)) or 1e-8
    snr = rng.uniform(*cfg.snr_db)
    mix += rng.standard_normal(n).astype(np.float32) * np.sqrt(power / 10 ** (snr / 10))
    return mix / max(1.0, float(np.abs(mix).max())), turns, uri


def simulate(out: str | pathlib.Path, cfg: SimConfig = SimConfig(), progress=None, jobs: int = 1) -> pathlib.Path:
    """Write ``cfg.n_mixtures`` mixtures under ``out`` with ``jobs`` processes; returns ``out``.

    Existing mixtures are reused; each mixture depends only on (seed, split,
    index), so the result is the same for any ``jobs``.
    """
    import soundfile as sf

    out = pathlib.Path(out)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    voices = variants(cfg.split)
    paths = [(out / "wav" / f"{mixture_uri(cfg, i)}.wav", out / "wav" / f"{mixture_uri(cfg, i)}.rttm")
             for i in range(cfg.n_mixtures)]
    todo = [i for i, (wav, rttm) in enumerate(paths) if not (wav.exists() and rttm.exists())]

    def finished():
        """(index, mixture) as each one is ready, from ``jobs`` processes or this one."""
        if jobs > 1 and len(todo) > 1:
            with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
                futures = {pool.submit(mixture, cfg, i, voices): i for i in todo}
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
        else:
            for i in todo:
                yield i, mixture(cfg, i, voices)

    for done, (i, (audio, turns, uri)) in enumerate(finished(), start=cfg.n_mixtures - len(todo) + 1):
        write_rttm(turns, paths[i][1])
        sf.write(paths[i][0], audio, cfg.sample_rate)  # written last: its presence marks a finished mixture
        if progress:
            progress(done, cfg.n_mixtures, uri)
    all_turns, uem = [], {}
    for i, (wav, rttm) in enumerate(paths):
        uri = mixture_uri(cfg, i)
        all_turns += read_rttm(rttm).get(uri, [])
        uem[uri] = [(0.0, sf.info(str(wav)).duration)]
    write_rttm(all_turns, out / "ref.rttm")
    write_uem(uem, out / "all.uem")
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return out


def mixture_uri(cfg: SimConfig, index: int) -> str:
    room = f"_rt{cfg.rt60[0]:g}-{cfg.rt60[1]:g}" if cfg.rt60 is not None else ""
    return f"{cfg.split}_b{cfg.beta:g}_s{cfg.n_speakers}{room}_{cfg.seed}_{index:05d}"
