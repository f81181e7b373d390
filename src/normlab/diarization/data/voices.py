"""Base voices for simulated conversations: which synthesizers, which voices, which split.

Three offline synthesizers, all Debian packages:

* ``espeak-ng`` (GPL-3.0-or-later): about 100 English voice variants, formant
  synthesis. Split by position in the sorted variant list: even positions
  for train, 1 mod 4 for dev, 3 mod 4 for test.
* ``flite`` (BSD-style, CMU/Edinburgh): the recorded voices kal, kal16, awb,
  rms, slt (diphone and cluster-unit synthesis from recordings of people).
* ``festival`` (BSD-style) with ``festvox-kallpc16k``, ``festvox-kdlpc16k``
  and ``festvox-us-slt-hts`` (free licences, see docs/diarization.md): kal
  and ked diphone voices, slt HTS.

The recorded voices come from five people (kal, ked, awb, rms, slt; kal and
slt are each rendered by two synthesizers). Splits are by *person*: train
hears kal, awb and slt; dev hears ked; test hears rms. No person, and no
espeak-ng variant, is in two splits. Each voice becomes many pseudo-speakers
downstream (pitch, speaking rate, a spectral warp: ``augment.py``).
"""
from __future__ import annotations

import functools
import hashlib
import pathlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue, Unavailable
from ..io.audio import read_mono

SPLITS = ("train", "dev", "test", "flite")  # "flite": flite's voices only (the older held-out set)
SOURCES = ("espeak", "all", "real", "mixed", "neural")  # "espeak": espeak-ng variants only; "all": also flite and
#            festival voices; "real": the split's recorded people only (prompts.py); "mixed": "all" and the
#            recorded people; "neural": the recorded people and the split's neural voices (neural.py)


@dataclass(frozen=True)
class Voice:
    synth: str  # "espeak-ng", "flite", "festival", "recorded" (prompts.py) or "neural" (neural.py)
    name: str  # the synthesizer's voice name
    person: str  # the recorded person (an espeak-ng variant is its own "person")
    f0: tuple[int, int] = (90, 150)  # mean F0 range to draw from, Hz (ignored where the voice has no control)

    @property
    def key(self) -> str:
        """A label token: no spaces; unique across synthesizers."""
        return f"{self.synth}.{self.name.replace('!v/', '').replace(' ', '_')}"

    @property
    def recorded(self) -> bool:
        """Made from recordings of a person (flite and festival voices, and real prompts)."""
        return self.synth != "espeak-ng"

    @property
    def real(self) -> bool:
        """A real person's own recordings (``prompts.py``), not a synthesizer."""
        return self.synth == "recorded"


FLITE_VOICES = ("awb", "kal16", "rms", "slt")  # the older "flite" split (kal is kal16 at 8 kHz)
#: recorded voices: (synth, name, person, F0 range); festival's names are its scheme voice functions
RECORDED = (
    Voice("flite", "kal", "kal", (85, 140)), Voice("flite", "kal16", "kal", (85, 140)),
    Voice("festival", "kal_diphone", "kal", (85, 140)),
    Voice("flite", "awb", "awb", (85, 140)),
    Voice("flite", "slt", "slt", (150, 230)), Voice("festival", "cmu_us_slt_arctic_hts", "slt", (150, 230)),
    Voice("festival", "ked_diphone", "ked", (85, 140)),
    Voice("flite", "rms", "rms", (85, 140)),
)
PERSONS = {"train": ("kal", "awb", "slt"), "dev": ("ked",), "test": ("rms",)}
#: Debian packages that provide each synthesizer or voice (apt-get, or ``make system-deps`` in a checkout)
PACKAGES = {"espeak-ng": ("espeak-ng",), "flite": ("flite",),
            "festival": ("festival", "festvox-kallpc16k", "festvox-kdlpc16k", "festvox-us-slt-hts")}
_FESTIVAL_DIRS = {"kal_diphone": "english/kal_diphone", "ked_diphone": "english/ked_diphone",
                  "cmu_us_slt_arctic_hts": "us/cmu_us_slt_arctic_hts"}


def tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise Unavailable(f"{name} is not installed (apt-get install {name}; in a checkout `make system-deps`)")
    return exe


def available(voice: Voice) -> bool:
    """Whether ``voice`` can be synthesized on this machine."""
    if voice.synth == "festival":
        return shutil.which("festival") is not None and \
            pathlib.Path("/usr/share/festival/voices", _FESTIVAL_DIRS[voice.name]).is_dir()
    return shutil.which(voice.synth) is not None


def espeak_variants(split: str) -> list[str]:
    """espeak-ng variant file names of a split (``-v en+<file>`` speaks them; positions in the list sorted by
    the variants' voice names: see the module doc).

    espeak-ng finds a variant by its file name, case and spaces included (``adam``, ``Mr serious``); given the
    listed voice name instead (``Adam``, ``Mr_Serious``), it speaks plain ``en`` without a word: 60 of the 101
    variants were the same default voice, in every split. And some variants speak alike (espeak-ng 1.51's
    ``klatt``, ``klatt6`` and ``caleb``, at the pitch and speed given): one that sounds as a variant of train
    (or, for test, of dev) is left out of the later split."""
    return list(_split_variants()[split])


@functools.cache
def _split_variants() -> dict[str, tuple[str, ...]]:
    out = subprocess.run([tool("espeak-ng"), "--voices=variant"], capture_output=True, text=True, check=True).stdout
    files = [file for _, file in _variant_table(out)]
    split = {"train": files[0::2], "dev": files[1::4], "test": files[3::4]}
    heard: set[str] = set()
    for name in ("train", "dev", "test"):
        sounds = {f: _sound(f) for f in split[name]}
        split[name] = tuple(f for f in split[name] if sounds[f] not in heard)
        heard |= set(sounds.values())
    return split


def _sound(variant: str) -> str:
    """A digest of what ``variant`` says for a probe sentence at a fixed pitch and speed (about 10 ms)."""
    said = subprocess.run([tool("espeak-ng"), "-v", f"en+{variant}", "-p", "50", "-s", "160", "--stdout",
                           "time year people"], capture_output=True, check=True).stdout
    return hashlib.sha256(said).hexdigest()


def _variant_table(listing: str) -> list[tuple[str, str]]:
    """``(voice name, file name)`` of each variant of ``espeak-ng --voices=variant``, sorted by voice name. A
    file name may hold a space (``!v/Mr serious``) and a voice name may overrun its column
    (``Half-LifeAnnouncementSystem``): the voice name is the fourth field, the file name what follows ``!v/`` up
    to two spaces (the other languages' column) or the end."""
    rows = []
    for line in listing.splitlines()[1:]:
        fields, at = line.split(), line.find("!v/")
        if len(fields) >= 5 and at >= 0:
            rows.append((fields[3], re.split(r"\s{2,}", line[at + 3:].strip())[0]))
    return sorted(rows)


def voices(split: str, sources: str = "espeak") -> list[Voice]:
    """The base voices of ``split``: espeak-ng variants, plus, with ``sources="all"``, the recorded voices
    of the split's persons that are installed here."""
    if split not in SPLITS:
        raise BadValue(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if sources not in SOURCES:
        raise BadValue(f"sources must be one of {', '.join(SOURCES)}, got {sources!r}")
    if split == "flite":
        tool("flite")
        return [Voice("flite", v, v) for v in FLITE_VOICES]
    from .prompts import installed

    real = [Voice("recorded", p.key, p.key) for p in installed(split)] if sources in ("real", "mixed", "neural") else []
    if sources == "neural":
        from . import neural

        out = real + [Voice("neural", v.key, v.key) for v in neural.installed(split)]
        if not any(v.synth == "neural" for v in out):
            raise Unavailable(f"no neural voices of the {split} split can be synthesized here ({neural.INSTALL}, "
                              "and espeak-ng)")
        return out
    if sources == "real":
        if not real:
            from .prompts import PERSONS as PROMPT_PERSONS

            names = sorted({pkg for person in PROMPT_PERSONS for pkg in person.packages})
            raise Unavailable(f"no recorded voices of the {split} split are installed (apt-get install "
                              f"{' '.join(names)}; in a checkout `make system-deps`)")
        return real
    out = [Voice("espeak-ng", v, f"espeak.{v}", (100, 200)) for v in espeak_variants(split)]
    if sources in ("all", "mixed"):
        out += [v for v in RECORDED if v.person in PERSONS[split] and available(v)]
    return out + real


def _festival_script(voice: str, texts: list[str], f0: float, stretch: float, folder: pathlib.Path) -> str:
    lines = [f"(voice_{voice})", f"(Parameter.set 'Duration_Stretch {stretch:.3f})"]
    if voice.endswith("_diphone"):  # linear-regression intonation: its target mean sets the pitch
        lines.append(f"(set! int_lr_params '((target_f0_mean {f0:.0f}) (target_f0_std {0.15 * f0:.0f}) "
                     "(model_f0_mean 170) (model_f0_std 34)))")
    else:  # HTS: its engine's own speed rate (-r) and shift in half-tones (-fm) from a 180 Hz voice
        lines.append(f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {1 / stretch:.3f}) '
                     f'(list "-fm" {12 * np.log2(f0 / 180):.2f}))))')
    for i, text in enumerate(texts):
        lines.append(f'(utt.save.wave (SynthText "{text}") "{folder / f"{i}.wav"}" \'riff)')
    return "\n".join(lines) + "\n"


def synthesize(voice: Voice, texts: list[str], f0: float, rate: float, sample_rate: int) -> list[np.ndarray]:
    """Each text spoken by ``voice`` at mean F0 ``f0`` Hz and ``rate`` times its normal speed, float32 samples
    at ``sample_rate`` with leading and trailing silence trimmed (a turn is speech)."""
    texts = [t.replace('"', "") for t in texts]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        if voice.synth == "festival":  # one process for all texts: its start-up dominates
            script = folder / "say.scm"
            script.write_text(_festival_script(voice.name, texts, f0, 1 / rate, folder))
            subprocess.run([tool("festival"), "-b", str(script)], check=True, capture_output=True)
        for i, text in enumerate(texts):
            wav = folder / f"{i}.wav"
            if voice.synth == "espeak-ng":  # -p 0-99 maps about linearly onto 70-230 Hz for the default voice
                pitch = int(np.clip((f0 - 70) / 1.6, 0, 99))
                cmd = [tool("espeak-ng"), "-v", f"en+{voice.name}", "-p", str(pitch), "-s", str(int(160 * rate)),
                       "-w", str(wav), text]
            elif voice.synth == "flite":
                cmd = [tool("flite"), "-voice", voice.name, "--setf", f"int_f0_target_mean={f0:.0f}",
                       "--setf", f"duration_stretch={1 / rate:.3f}", "-t", text, "-o", str(wav)]
            else:
                cmd = None
            if cmd:
                subprocess.run(cmd, check=True, capture_output=True)
        return [_trimmed(read_mono(folder / f"{i}.wav", sample_rate).numpy()) for i in range(len(texts))]


def _trimmed(speech: np.ndarray) -> np.ndarray:
    """Without leading and trailing samples below 1e-3 (a turn is speech)."""
    voiced = np.flatnonzero(np.abs(speech) > 1e-3)
    return speech[voiced[0] : voiced[-1] + 1] if voiced.size else speech
