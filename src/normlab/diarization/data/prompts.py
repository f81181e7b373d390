"""Real people's voices: recorded prompt collections shipped as Debian packages.

Each :class:`Person` is one human voice, wherever its recordings live: the
Asterisk core sounds name their speaker in the folder (``en_US_f_Allison``
and ``es_MX_f_Allison`` are one person, Allison Smith, in two languages;
``it_IT_m_Carlo``, ``fr_CA_f_June``, ``ru_RU_f_IvrvoiceRU`` are three more),
and GE2E similarity confirms it (docs/diarization.md, "Real voices"). The
other packages are one person each. Splits are by person, never by file:
no person is heard in two of ``train``, ``dev`` and ``test``.

A prompt is one recorded item (a sentence, a word, a digit, a syllable),
read at 8 kHz, with its leading and trailing silence removed. Items under
``SHORT`` seconds serve as backchannels ("yes", "okay", a digit) in the
simulated conversations (``conversation.py``).
"""
from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue
from ..io.audio import EmptyAudio

SOUNDS = pathlib.Path("/usr/share/asterisk/sounds")
SHORT = 0.8  # seconds: prompts shorter than this are backchannel material


@dataclass(frozen=True)
class Person:
    key: str  # label token
    packages: tuple[str, ...]  # Debian packages holding the recordings
    globs: tuple[str, ...]  # file patterns, absolute
    language: str
    sex: str  # "f" or "m", as the recordings' folder or copyright file says
    licence: str  # of the recordings, from the package's copyright file


def _core(folder: str) -> str:
    return str(SOUNDS / folder / "**" / "*.wav")


PERSONS = (
    Person("allison", ("asterisk-core-sounds-en-wav", "asterisk-core-sounds-es-wav"),
           (_core("en_US_f_Allison"), _core("es_MX_f_Allison")), "en+es", "f",
           "CC-BY-SA-3.0 (Allison Smith; asterisk-core-sounds copyright file)"),
    Person("june", ("asterisk-core-sounds-fr-wav",), (_core("fr_CA_f_June"),), "fr", "f",
           "CC-BY-SA-3.0 (June Wallack; asterisk-core-sounds copyright file)"),
    Person("carlo", ("asterisk-core-sounds-it-wav",), (_core("it_IT_m_Carlo"),), "it", "m",
           "CC-BY-SA-3.0 (asterisk-core-sounds copyright file)"),
    Person("gcin", ("gcin-voice",), ("/usr/share/gcin-voice/ogg/*/*.ogg",), "zh", "f",
           "CC-BY-3.0 (recordings by Chu Lo; gcin-voice copyright file)"),
    Person("ivrvoice_ru", ("asterisk-core-sounds-ru-wav",), (_core("ru_RU_f_IvrvoiceRU"),), "ru", "f",
           "CC-BY-SA-3.0 (asterisk-core-sounds copyright file)"),
    Person("armelle", ("asterisk-prompt-fr-armelle",),
           (str(SOUNDS / "fr" / "*.gsm"), str(SOUNDS / "fr" / "*" / "*.gsm"), str(SOUNDS / "*" / "fr" / "*.gsm")),
           "fr", "f", "BSD-style, or GPL (Armelle Desjardins; asterisk-prompt-fr-armelle copyright file)"),
    Person("menardi", ("asterisk-prompt-it-menardi-wav",), (_core("it_IT_f_Menardi"),), "it", "f",
           "CC-BY-SA-3.0 Italian (Paola Dal Zot; asterisk-prompt-it-menardi-wav copyright file)"),
    Person("es_co", ("asterisk-prompt-es-co",),
           (str(SOUNDS / "es" / "*.gsm"), str(SOUNDS / "es" / "*" / "*.gsm"), str(SOUNDS / "*" / "es" / "*.gsm")),
           "es", "f", "GPL-2 (July E. Jimenez, Avatar Ltda.; asterisk-prompt-es-co copyright file)"),
)
#: persons per split: train gets the most material and the one male voice; dev and test two persons each
SPLIT_PERSONS = {"train": ("allison", "june", "carlo", "gcin"), "dev": ("ivrvoice_ru", "armelle"),
                 "test": ("menardi", "es_co")}
#: music-on-hold recordings (asterisk-moh-opsound-wav, CC-BY-SA-3.0): a noise source, never speech
MUSIC = ("/usr/share/asterisk/moh/*.wav",)
MUSIC_PACKAGE = "asterisk-moh-opsound-wav"
MUSIC_LICENCE = "CC-BY-SA-3.0 (Macroform, Manolo Camp, Reno Project; asterisk-moh-opsound-wav copyright file)"


def person(key: str) -> Person:
    for p in PERSONS:
        if p.key == key:
            return p
    raise BadValue(f"unknown person {key!r}; known: {', '.join(p.key for p in PERSONS)}")


def files(p: Person) -> list[pathlib.Path]:
    """The person's recordings installed here, sorted (empty when its packages are missing)."""
    found: set[pathlib.Path] = set()
    for pattern in p.globs:
        root = pathlib.Path(pattern).anchor
        found.update(pathlib.Path(root).glob(str(pathlib.Path(pattern).relative_to(root))))
    # each recording once: a folder linked under two names (asterisk's digits/fr -> ../fr/digits) listed its
    # prompts twice, and they were drawn twice as often
    unique: dict[pathlib.Path, pathlib.Path] = {}
    for f in sorted(found):
        if f.is_file() and f.stat().st_size > 0:
            unique.setdefault(f.resolve(), f)
    return sorted(unique.values())


def installed(split: str) -> list[Person]:
    """The persons of ``split`` whose recordings are installed here."""
    if split not in SPLIT_PERSONS:
        raise BadValue(f"split must be one of {', '.join(SPLIT_PERSONS)}, got {split!r}")
    return [person(k) for k in SPLIT_PERSONS[split] if files(person(k))]


def read(path: pathlib.Path, sample_rate: int = 8000) -> np.ndarray:
    """Mono float32 samples of a WAV, Ogg or headerless GSM file at ``sample_rate``. The recording reader's
    advice for a file too quiet to diarize is not said: a prompt that quiet (the packages' ``silence/`` files)
    is dropped as no speech (30 such lines the first time the persons' prompts were read)."""
    import warnings

    from ..io.audio import read_mono

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*too quiet to diarize")
        return read_mono(path, sample_rate).numpy()


def trim(x: np.ndarray, sample_rate: int, floor_db: float = -40.0) -> np.ndarray:
    """``x`` without leading and trailing frames 40 dB below its loudest 20 ms frame (a prompt is speech)."""
    hop = sample_rate // 50
    n = len(x) // hop
    if n == 0:
        return x
    db = 10 * np.log10(np.mean(x[: n * hop].reshape(n, hop) ** 2, axis=1) + 1e-12)
    keep = np.flatnonzero(db > db.max() + floor_db)
    return x[keep[0] * hop : (keep[-1] + 1) * hop]


def _cache_dir() -> pathlib.Path:
    """Decoded prompts live in normlab's user cache, beside the built kernels (``$NORMLAB_CACHE_DIR``)."""
    from ...kernels.build import cache_root

    return cache_root() / "prompts"


def cached_items(cache: pathlib.Path, trimmed: Iterable[np.ndarray], sample_rate: int) -> tuple[np.ndarray, ...]:
    """The recorded or synthesized items saved in ``cache`` (an ``.npz``), else those of ``trimmed`` (drawn only
    then) longer than 0.2 s and not silent, each at peak 0.5, saved there atomically (a temporary file renamed;
    a read-only cache only costs making them again)."""
    import os

    if cache.is_file():
        with np.load(cache) as z:
            return tuple(z[f"a{i}"] for i in range(len(z.files)))
    out = tuple((x / np.abs(x).max() * 0.5).astype(np.float32) for x in trimmed
                if len(x) > 0.2 * sample_rate and np.abs(x).max() > 1e-4)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **{f"a{i}": x for i, x in enumerate(out)})
        os.replace(tmp, cache)
    except OSError:
        pass
    return out


@functools.lru_cache(maxsize=16)
def prompts(key: str, sample_rate: int = 8000) -> tuple[np.ndarray, ...]:
    """Every trimmed prompt of person ``key`` longer than 0.2 s, peak 0.5 (cached per process and on disk,
    keyed on the files' names, sizes and times: a changed package is read again)."""
    import hashlib

    paths = files(person(key))
    stamp = hashlib.sha1("".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns};" for f in paths).encode())

    def trimmed():
        for f in paths:
            try:
                yield trim(read(f, sample_rate), sample_rate)
            except EmptyAudio:  # a header without samples (asterisk-core-sounds-ru-wav ships one): no prompt
                continue

    return cached_items(_cache_dir() / f"{key}-{sample_rate}-{stamp.hexdigest()[:12]}.npz", trimmed(), sample_rate)


@functools.lru_cache(maxsize=2)
def music(sample_rate: int = 8000) -> tuple[np.ndarray, ...]:
    """The music-on-hold tracks (noise material), empty when asterisk-moh-opsound-wav is missing."""
    paths = sorted(f for pattern in MUSIC for f in pathlib.Path("/").glob(pattern.lstrip("/")))
    return tuple(read(f, sample_rate) for f in paths)
