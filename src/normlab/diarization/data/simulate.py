"""Simulated conversations without downloads (EEND's recipe, Fujita et al. 2019).

Per mixture, ``k`` speakers are drawn from the split's base voices
(``voices.py``: espeak-ng variants, and with ``sources="all"`` the recorded
flite and festival voices; train, dev and test never share a voice or a
person). ``k`` is ``n_speakers``, or with ``min_speakers`` set it cycles
through ``min_speakers..n_speakers`` by index, so every count is equally
represented. Each speaker gets a mean F0 and a speaking rate (the
synthesizer's) and, with ``augment``, a spectral warp and a level
(``augment.py``): one voice, many speakers. Per speaker, ``utterances``
utterances of random words, each preceded by silence ~ Exponential(beta)
seconds; with ``beta_by_count`` beta grows with ``k`` as in EEND-EDA's
simulation (x1, x1, x2.5, x4.5 for 1-4 speakers: 2, 2, 5, 9 s at beta = 2),
so more speakers do not mean more overlap. The speaker tracks are summed.

Channel: without ``augment``, white noise at an SNR drawn from ``snr_db``,
and with ``rt60`` set each track is first convolved with its own synthetic
room response. With ``augment``, a room with probability 0.5, white, pink,
brown or babble noise (other voices of the same split) at 5-25 dB SNR, a
telephone channel with probability 0.2 and a random level. No perturbation
moves a turn. Each mixture is seeded by (seed, split, index), written as
``wav/<uri>.wav`` with ``ref.rttm`` and ``all.uem``; existing mixtures are
kept (re-running resumes).
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from concurrent.futures import as_completed
from dataclasses import MISSING, asdict, dataclass, replace

import numpy as np

from ... import workers, written
from ..._checks import BadValue
from ..io.features import FEATURE_RATE
from ..io.rttm import Turn, format_rttm, read_rttm, write_rttm
from ..io.uem import format_uem
from . import augment as aug
from . import nonspeech
from .augment import reverberate, room_impulse_response  # noqa: F401  (re-exported: older imports)
from .voices import FLITE_VOICES, SPLITS, Voice, synthesize, voices

WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()
BETA_SCALE = {1: 1.0, 2: 1.0, 3: 2.5, 4: 4.5}  # EEND-EDA's 2, 2, 5, 9 s over its 2 s


@dataclass(frozen=True)
class SimConfig:
    n_mixtures: int = 100
    n_speakers: int = 2  # speakers per mixture, or the most with min_speakers
    beta: float = 2.0  # mean silence before each utterance, seconds (smaller: more overlap)
    min_utterances: int = 5
    max_utterances: int = 20
    snr_db: tuple[float, float] = (10.0, 20.0)  # white noise, without augment
    sample_rate: int = FEATURE_RATE  # the EEND features' rate
    split: str = "train"  # "train", "dev", "test" (disjoint voices) or "flite"
    seed: int = 0
    rt60: tuple[float, float] | None = None  # reverberation time range, seconds (None: dry)
    min_speakers: int = 0  # > 0: mixture i has min_speakers + i % (n_speakers - min_speakers + 1) speakers
    sources: str = "espeak"  # voices.SOURCES: "espeak", "all" (also flite and festival), "real", "mixed", "neural"
    augment: bool = False  # speaker warps and levels, rooms, noise types, telephone, gain (augment.Perturbation)
    beta_by_count: bool = False  # beta x BETA_SCALE[k] for k speakers
    style: str = "mixture"  # "mixture": EEND's independent timelines; "conversation": turn-taking (conversation.py);
    #                         "nonspeech": recordings of sounds alone, nobody speaking (nonspeech.py)
    real_p: float = 0.7  # conversation style: share of speakers drawn from real people when the pool has them
    stretch_p: float = 0.0  # conversation style: probability of a 3-12 s pause filled with a sound (nonspeech.py)
    duration: tuple[float, float] | None = None  # conversation style: seconds of talk to fill, drawn per recording
    #                                              (None: conversation.TurnTaking's 20-45 s)

    def __post_init__(self):
        if not (isinstance(self.n_mixtures, int) and 0 <= self.n_mixtures <= MAX_MIXTURES):
            raise BadValue(f"n_mixtures must be a whole number in [0, {MAX_MIXTURES:,}], got {self.n_mixtures!r}")
        if self.style not in ("mixture", "conversation", "nonspeech"):
            raise BadValue(f"style must be mixture, conversation or nonspeech, got {self.style!r}")
        if not 0.0 <= self.stretch_p <= 1.0 or (self.stretch_p and self.style != "conversation"):
            raise BadValue(f"stretch_p is a probability for style 'conversation', got {self.stretch_p} with "
                           f"style {self.style!r}")
        lo = self.min_speakers or self.n_speakers
        if not 1 <= lo <= self.n_speakers:
            raise BadValue(f"need 1 <= min_speakers <= n_speakers, got {self.min_speakers} and {self.n_speakers}")
        if not 1 <= self.min_utterances <= self.max_utterances <= MAX_UTTERANCES:
            raise BadValue(f"need 1 <= min_utterances <= max_utterances <= {MAX_UTTERANCES}, got "
                           f"{self.min_utterances} and {self.max_utterances}")
        if not 0 < self.beta <= 600:
            raise BadValue(f"beta (the mean silence, s) must be a number of seconds in (0, 600], got {self.beta}")
        if not (isinstance(self.seed, int) and self.seed >= 0):
            raise BadValue(f"seed must be a whole number >= 0, got {self.seed!r}")
        if self.rt60 is not None and not MIN_RT60 <= self.rt60[0] <= self.rt60[1] <= MAX_RT60:
            raise BadValue(f"rt60 must be MIN MAX seconds with {MIN_RT60:g} <= MIN <= MAX <= {MAX_RT60:g} (a small "
                           f"room reads about 0.2, a cathedral about 8), got {list(self.rt60)}")
        if self.duration is not None and self.style != "conversation":  # not a range error: the wrong style
            raise BadValue(f"duration (seconds of talk) is for style 'conversation'; style {self.style!r} draws "
                           "its length from its utterances: leave it out")
        if self.duration is not None and (len(self.duration) != 2
                                          or not 1.0 <= self.duration[0] <= self.duration[1] <= MAX_DURATION):
            raise BadValue(f"duration is MIN MAX seconds of talk with 1 <= MIN <= MAX <= {MAX_DURATION:g}, for style "
                           f"'conversation', got {self.duration!r} with style {self.style!r}")
        if self.style == "nonspeech" and (self.rt60 is not None or self.augment):
            raise BadValue("rt60 and augment shape voices; style 'nonspeech' writes its sounds as they are (the "
                           "recordings came out the same, the settings recorded as if applied): leave them out")
        if self.style == "mixture" and self.sources in ("real", "mixed", "neural"):
            raise BadValue(f"sources {self.sources!r} hold recorded people, who speak their prompts in style "
                           "'conversation'; EEND-style mixtures synthesize every sentence (sources 'espeak' or 'all')")

    def speakers_of(self, index: int) -> int:
        lo = self.min_speakers or self.n_speakers
        return lo + index % (self.n_speakers - lo + 1)


#: the longest reverberation time a room may have, seconds (its impulse response is this long), and the most
#: utterances a speaker may have in one recording: beyond them a request is a typo, not a room or a mixture
MAX_RT60 = 10.0
#: the shortest: below it the impulse response is under a sample or two at 8 kHz (no room is that dry)
MIN_RT60 = 0.01
#: the most mixtures one folder is asked for (about 8,000 hours of talk): a count beyond any disk was accepted, and
#: the folder's check listed every name in memory before anything was written (gigabytes, silently)
MAX_MIXTURES = 1_000_000
MAX_UTTERANCES = 500
#: the longest conversation: an hour (a real person's prompts, about half an hour, run out before that: the
#: recording ends where every speaker has said all of theirs)
MAX_DURATION = 3600.0


def variants(split: str) -> list[str]:
    """Voice names of a split with espeak-ng only (``flite``: flite's voices); see ``voices.voices``."""
    return [v.name for v in voices(split)]


def _turn(uri: str, first: int, length: int, sr: int, speaker: str) -> Turn:
    """The turn of samples ``first .. first + length`` in milliseconds: its start rounded, its end rounded down,
    so that it never ends past its speech or the file (start and length rounded apart ended up to 1 ms past)."""
    start, end = round(first / sr, 3), (first + length) * 1000 // sr / 1000
    return Turn(uri, start, round(max(end - start, 0.0), 3), speaker)


def _as_voice(v: Voice | str) -> Voice:
    if isinstance(v, Voice):
        return v
    return Voice("flite", v, v, (112, 208)) if v in FLITE_VOICES else Voice("espeak-ng", v, f"espeak.{v}", (100, 200))


def persons_for(pool: list[Voice], k: int) -> list[str]:
    """The pool's persons, sorted; BadValue where they are fewer than the ``k`` speakers asked."""
    persons = sorted({v.person for v in pool})
    if k > len(persons):
        raise BadValue(f"{k} speakers asked, but the split has {len(persons)} distinct voices")
    return persons


def pick_voices(pool: list[Voice], k: int, rng: np.random.Generator) -> list[Voice]:
    """``k`` voices of ``k`` different persons; recorded voices as a group are drawn as often as espeak-ng's."""
    persons = persons_for(pool, k)
    recorded = {v.person for v in pool if v.recorded}
    n_rec, n_esp = len(recorded), len(persons) - len(recorded)
    w = np.array([(0.5 / n_rec if n_esp else 1 / n_rec) if p in recorded else (0.5 / n_esp if n_rec else 1 / n_esp)
                  for p in persons])
    chosen = rng.choice(len(persons), size=k, replace=False, p=w / w.sum())
    out = []
    for i in chosen:
        options = [v for v in pool if v.person == persons[i]]
        out.append(options[int(rng.integers(len(options)))])
    return out


def _words(rng: np.random.Generator, lo: int = 3, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi + 1))))


def mixture(cfg: SimConfig, index: int, pool: list) -> tuple[np.ndarray, list[Turn], str]:
    """Mixture ``index``: samples, reference turns and its uri."""
    rng = np.random.default_rng([cfg.seed, index, SPLITS.index(cfg.split)])
    uri, sr = mixture_uri(cfg, index), cfg.sample_rate
    pool = [_as_voice(v) for v in pool]
    pert = aug.Perturbation()
    k = cfg.speakers_of(index)
    beta = cfg.beta * (BETA_SCALE.get(k, k / 2) if cfg.beta_by_count else 1.0)
    tracks, turns = [], []
    for voice in pick_voices(pool, k, rng):  # the same draws with and without augment: the same turns
        f0, rate = float(rng.uniform(*voice.f0)), float(rng.uniform(*pert.rate))
        alpha, level_db = float(rng.uniform(*pert.warp)), float(rng.uniform(*pert.level_db))
        label = f"{voice.key}.f{f0:.0f}.r{100 * rate:.0f}"
        n = int(rng.integers(cfg.min_utterances, cfg.max_utterances + 1))
        silences = [rng.exponential(beta) for _ in range(n)]
        speech = synthesize(voice, [_words(rng) for _ in range(n)], f0, rate, sr)
        pieces, at = [], 0  # at: the next piece's first sample
        for silence, s in zip(silences, speech):
            gap = int(silence * sr)
            pieces += [np.zeros(gap, np.float32), s]
            turns.append(_turn(uri, at + gap, len(s), sr, label))
            at += gap + len(s)
        track = np.concatenate(pieces)
        if cfg.augment:
            track = aug.warp(track, alpha, sr) * 10 ** (level_db / 20)
        tracks.append(track)
    if cfg.rt60 is not None:
        tracks = [reverberate(x, rng.uniform(*cfg.rt60), sr, rng) for x in tracks]
    elif cfg.augment and rng.random() < pert.reverb_p:
        rt60 = rng.uniform(*pert.rt60)
        tracks = [reverberate(x, rt60, sr, rng) for x in tracks]  # one room, a response per talker position
    n = max(len(x) for x in tracks)
    mix = np.zeros(n, np.float32)
    for x in tracks:
        mix[: len(x)] += x
    if not cfg.augment:
        noise = rng.standard_normal(n).astype(np.float32)
        mix = aug.add_noise(mix, noise, rng.uniform(*cfg.snr_db))
        return mix / max(1.0, float(np.abs(mix).max())), turns, uri
    kind = aug.NOISES[int(rng.choice(len(aug.NOISES), p=pert.noise_p))]
    if kind == "babble":
        # espeak-ng's variants where the split has them; else its other voices (flite's split has none: a crash)
        others = [v for v in pool if v.synth == "espeak-ng"] or list(pool)
        talkers = [others[int(i)] for i in rng.choice(len(others), size=min(4, len(others)), replace=False)]
        noise = aug.babble([synthesize(v, [_words(rng, 6, 12)], float(rng.uniform(*v.f0)), 1.0, sr)[0]
                            for v in talkers], n, rng)
    else:
        noise = aug.colored_noise(kind, n, rng)
    mix = aug.add_noise(mix, noise, rng.uniform(*pert.snr_db))
    if rng.random() < pert.telephone_p:
        mix = aug.telephone(mix, sr)
    return aug.gain(mix, rng.uniform(*pert.peak_db)), turns, uri


def pick_speakers(pool: list[Voice], k: int, real_p: float, rng: np.random.Generator) -> list[Voice]:
    """``k`` voices of ``k`` different persons; each is a real person's with probability ``real_p``
    while any is left."""
    real = [v for v in pool if v.real]
    synth = [v for v in pool if not v.real]
    n_real = min(len(real), int(rng.binomial(k, real_p)) if synth else k)
    n_real = max(n_real, k - len({v.person for v in synth}))
    if n_real > len(real):
        raise BadValue(f"{k} speakers asked, but the split has {len(real) + len({v.person for v in synth})} persons")
    chosen = [real[int(i)] for i in rng.choice(len(real), size=n_real, replace=False)] if n_real else []
    return chosen + (pick_voices(synth, k - n_real, rng) if k > n_real else [])


def conversation(cfg: SimConfig, index: int, pool: list) -> tuple[np.ndarray, list[Turn], str]:
    """Conversation ``index``: turn-taking timing (``conversation.schedule``) filled with the speakers' own
    utterances, then each speaker's warp and level, the room, the noise, the channel."""
    from . import conversation as conv
    from .prompts import music

    rng = np.random.default_rng([cfg.seed, index, SPLITS.index(cfg.split), 1])
    uri, sr = mixture_uri(cfg, index), cfg.sample_rate
    tt, ch = conv.TurnTaking(), conv.Channel()
    more = 1  # a longer conversation draws as many more utterances per speaker as it may last longer
    if cfg.duration is not None:
        more = max(1, math.ceil(cfg.duration[1] / tt.duration[1]))
        tt = replace(tt, duration=(float(cfg.duration[0]), float(cfg.duration[1])))
    k = cfg.speakers_of(index)
    speakers = pick_speakers([_as_voice(v) for v in pool], k, cfg.real_p, rng)
    utts, short = [], []
    for v in speakers:
        u, s = conv.utterances(v, (40 if v.real else 14) * more, rng, sr)
        utts.append(u)
        short.append(s)
    segments = conv.schedule(k, [[len(x) / sr for x in u] for u in utts], short, tt, rng)
    end = max(seg.start + sum(len(utts[seg.speaker][i]) for i in seg.items) / sr + sum(seg.gaps) for seg in segments)
    n = int((end + float(rng.uniform(0.0, 1.5))) * sr) + 1
    tracks = [np.zeros(n, np.float32) for _ in range(k)]
    labels = []
    for v in speakers:
        warp = float(rng.uniform(0.9, 1.12)) if cfg.augment else 1.0
        labels.append(f"{v.key}.w{100 * warp:.0f}")
    turns = []
    for seg in segments:
        t = seg.start
        for m, i in enumerate(seg.items):
            t += seg.gaps[m - 1] if m else 0.0
            x = utts[seg.speaker][i]
            a = int(round(t * sr))
            tracks[seg.speaker][a : a + len(x)] += x[: n - a]
            turns.append(_turn(uri, a, min(len(x), n - a), sr, labels[seg.speaker]))
            t = a / sr + len(x) / sr
    span, extra = None, np.random.default_rng([cfg.seed, index, SPLITS.index(cfg.split), 2])  # its own stream:
    if cfg.stretch_p and extra.random() < cfg.stretch_p:  # without a stretch, the conversation is the same
        tracks, turns, span = nonspeech.insert_stretch(tracks, turns, sr, extra)
        n = len(tracks[0])
    if cfg.augment:
        for j in range(k):
            alpha = float(labels[j].rsplit(".w", 1)[1]) / 100
            tracks[j] = aug.warp(tracks[j], alpha, sr) * 10 ** (float(rng.uniform(-6, 6)) / 20)
        if rng.random() < ch.room_p:
            rt60, tail = float(rng.uniform(*ch.rt60)), (float(rng.uniform(1.0, 2.0)) if rng.random() < ch.far_p
                                                         else float(rng.uniform(0.2, 0.5)))
            tracks = [reverberate(x, rt60, sr, rng, tail) for x in tracks]
    mix = np.sum(tracks, axis=0).astype(np.float32)
    if span is not None:
        mix = nonspeech.add_sound(mix, span, sr, extra)
    kinds = list(conv.NOISE_KINDS)
    p = np.array(ch.noise_p)
    if not music(sr):
        p[kinds.index("music")] = 0.0
    kind = kinds[int(rng.choice(len(kinds), p=p / p.sum()))] if cfg.augment else "white"
    if kind == "babble":
        others = ([v for v in pool if _as_voice(v).real] or [v for v in pool if _as_voice(v).synth == "espeak-ng"]
                  or list(pool))  # (flite's split has neither)
        talkers = [_as_voice(others[int(i)]) for i in rng.integers(len(others), size=5)]
        noise = aug.babble([conv.utterances(v, 3, rng, sr)[0][0] for v in talkers], n, rng)
    elif kind == "music":
        noise = aug.music(list(music(sr)), n, rng)
    else:
        noise = aug.colored_noise(kind, n, rng)
    snr = rng.uniform(*(ch.snr_db if cfg.augment else cfg.snr_db))
    mix = aug.add_noise(mix, noise, snr)
    if cfg.augment and rng.random() < ch.telephone_p:
        mix = aug.telephone(mix, sr)
    peak = rng.uniform(*ch.peak_db) if cfg.augment else -1.0
    return aug.gain(mix, peak), sorted(turns, key=lambda t: t.start), uri


def sounds_alone(cfg: SimConfig, index: int, pool: list) -> tuple[np.ndarray, list[Turn], str]:
    """Recording ``index`` of style "nonspeech": sounds alone (``nonspeech.alone``), an empty reference."""
    audio = nonspeech.alone(index, cfg.seed, SPLITS.index(cfg.split), cfg.sample_rate)
    return audio, [], mixture_uri(cfg, index)


def simulate(out: str | pathlib.Path, cfg: SimConfig = SimConfig(), progress=None, jobs: int = 1) -> pathlib.Path:
    """Write ``cfg.n_mixtures`` mixtures under ``out`` with ``jobs`` processes; returns ``out``.

    Existing mixtures are reused; each mixture depends only on (seed, split,
    index), so the result is the same for any ``jobs``.
    """
    import soundfile as sf

    out = pathlib.Path(out)
    _not_users(out)  # first: another's config.json is not read as normlab's settings
    pool = voices(cfg.split, cfg.sources) if cfg.style != "nonspeech" else []
    if pool:
        persons_for(pool, cfg.n_speakers)  # before anything is written
    keys = [v.key for v in pool]
    _same_settings(out, cfg, keys)
    _no_others(out, cfg)
    _references_unchanged(out)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    settings = json.dumps({**asdict(cfg), "voices": keys}, indent=2) + "\n"
    _write_config(out, settings)  # first: it marks the folder as normlab's (a killed run resumes)
    make = {"conversation": conversation, "mixture": mixture, "nonspeech": sounds_alone}[cfg.style]
    paths = [(out / "wav" / f"{mixture_uri(cfg, i)}.wav", out / "wav" / f"{mixture_uri(cfg, i)}.rttm")
             for i in range(cfg.n_mixtures)]
    todo = [i for i, (wav, rttm) in enumerate(paths) if not (wav.exists() and rttm.exists())]
    _record_made_with(out, keys, fresh=not any((out / "wav").glob("*.wav")))

    def finished():
        """(index, mixture) as each one is ready, from ``jobs`` processes or this one."""
        if jobs > 1 and len(todo) > 1:
            with workers.pool(jobs) as pool_:  # (an interrupt stops the workers, as Ctrl-C does)
                futures = {pool_.submit(make, cfg, i, pool): i for i in todo}
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
        else:
            for i in todo:
                yield i, make(cfg, i, pool)

    # ``progress(k, n, uri)`` as every progress callback: ``k`` counted from 0 (the k + 1-th mixture is ready)
    for done, (i, (audio, turns, uri)) in enumerate(finished(), start=cfg.n_mixtures - len(todo)):
        write_rttm(turns, paths[i][1])
        # written last, whole: its presence marks a finished mixture (a kill inside the write leaves only the
        # temporary file, which the rerun writes again)
        tmp = paths[i][0].with_name(paths[i][0].name + ".part")
        with written.full_disk_said(tmp, tmp):  # libsndfile: a RuntimeError, "System error" on a full disk
            sf.write(tmp, audio, cfg.sample_rate, format="WAV")
        os.replace(tmp, paths[i][0])
        if progress:
            progress(done, cfg.n_mixtures, uri)
    all_turns, uem = [], {}
    for i, (wav, rttm) in enumerate(paths):
        uri = mixture_uri(cfg, i)
        all_turns += read_rttm(rttm).get(uri, [])
        uem[uri] = [(0.0, sf.info(str(wav)).duration)]
    ours = written.listed(out)
    for name, text in (("ref.rttm", format_rttm(all_turns)), ("all.uem", format_uem(uem))):
        if not _holds(out / name, text):
            (out / name).write_text(text, encoding="utf-8")
        if ours.get(name) != written.digest(out / name):
            written.record(out / name)
    _write_config(out, settings)
    return out


def _holds(path: pathlib.Path, text: str) -> bool:
    """Whether ``path`` holds ``text`` already: then it is not written again (a finished folder simulated again
    with the same settings is left as it is; read-only, it failed on a temporary file's name)."""
    try:
        return path.is_file() and path.read_bytes() == text.encode("utf-8")
    except OSError:
        return False


def _references_unchanged(out: pathlib.Path) -> None:
    """``ref.rttm`` and ``all.uem`` are written again from the mixtures' own references at the end of every run: a
    user's edits to them since (a turn set right, a narrower UEM) were replaced without a word. Refused where the
    folder's list of what normlab wrote holds them and they changed (a folder simulated before it kept them passes)."""
    ours = written.listed(out)
    for name in ("ref.rttm", "all.uem"):
        path = out / name
        if name in ours and path.is_file() and written.digest(path) != ours[name]:
            raise BadValue(f"{path} was changed since normlab wrote it, and simulating writes it again from the "
                           "mixtures' own references: move it away first (or copy your edits elsewhere)")


#: what made a folder's audio: its voices' packages with their versions and licences, and normlab's, torch's,
#: Python's and numpy's versions, as they were where it was simulated (``training.provenance.folder_sources``
#: reads them). Apart from config.json: a training resume compares that file's bytes, and this one is kept
MADE_WITH = "made_with.json"


def _record_made_with(out: pathlib.Path, keys: list[str], fresh: bool) -> None:
    """Write ``out/made_with.json`` (the voices ``keys``' packages and the versions) once, before the folder's first
    recording: a later run (a resume, a folder grown, another machine) keeps it, and a folder that holds audio
    of an unknown making gets none."""
    if not fresh or (out / MADE_WITH).exists():
        return
    from ..training.provenance import sources, versions

    text = json.dumps({**sources(keys), "versions": versions()}, indent=2) + "\n"
    written.replace_whole(out / MADE_WITH, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _write_config(out: pathlib.Path, settings: str) -> None:
    """``out/config.json``, written whole: a half-written one would no longer mark the folder as normlab's, and
    the rerun would refuse it. Not written again where it holds these settings already."""
    if _holds(out / "config.json", settings):
        return
    written.replace_whole(out / "config.json", lambda tmp: tmp.write_text(settings, encoding="utf-8"))


def _no_others(out: pathlib.Path, cfg: SimConfig) -> None:
    """A folder that holds recordings beyond the ``n_mixtures`` asked for (a rerun with a smaller count) would get
    a ``ref.rttm`` without them while training and scoring read every ``wav/*.wav``: refused."""
    names = {f"{mixture_uri(cfg, i)}.wav" for i in range(cfg.n_mixtures)}
    others = sorted(p.name for p in (out / "wav").glob("*.wav") if p.name not in names) if (out / "wav").is_dir() \
        else []
    if others:
        raise BadValue(f"{out} holds {len(others)} recording{'s' * (len(others) != 1)} beyond the {cfg.n_mixtures} "
                       f"asked for ({others[0]}{', ...' if len(others) > 1 else ''}): the reference would leave them "
                       "out; simulate into another folder, or ask for at least as many mixtures as it holds")


#: keys every normlab version's simulation ``config.json`` holds: what tells it from someone else's file of that name
_CONFIG_KEYS = ("n_mixtures", "n_speakers", "beta", "sample_rate", "split", "seed")


def _simulated_here(config: pathlib.Path) -> bool:
    """Whether ``config`` is a ``config.json`` that ``simulate`` wrote (a JSON object with its settings)."""
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(settings, dict) and all(k in settings for k in _CONFIG_KEYS)


def _not_users(out: pathlib.Path) -> None:
    """A folder without normlab's ``config.json`` that already holds a ``config.json``, a ``ref.rttm``, an
    ``all.uem`` or files in ``wav/`` is someone else's data: simulating there would replace its reference and
    settings and mix new recordings into it."""
    if _simulated_here(out / "config.json"):
        return
    wav = out / "wav"
    theirs = [p for p in (out / "config.json", out / "ref.rttm", out / "all.uem") if p.exists()]
    theirs += sorted(wav.iterdir())[:1] if wav.is_dir() else []
    if theirs:
        raise BadValue(f"{out} holds {theirs[0]} but was not simulated by normlab (it has no config.json of "
                       "normlab's): simulate into another folder")


def _same_settings(out: pathlib.Path, cfg: SimConfig, pool: list[str]) -> None:
    """A folder simulated before resumes (or grows: ``n_mixtures`` may rise) with the same settings and voices
    (``pool``, their keys) only: with others its ``ref.rttm`` would describe the new mixtures beside the old ones'
    audio, and the voices drawn for the rest would come from another pool (a synthesizer installed since)."""
    if not any((out / "wav").glob("*.wav")):
        return  # no mixture finished there yet: no settings to keep
    try:
        old = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return  # nothing simulated there yet (or not by normlab: its wav/ files are not read)
    new, fields = asdict(cfg), SimConfig.__dataclass_fields__
    # a setting an earlier version did not write ran at its default then (a folder of 20-45 s conversations
    # grew with --duration 120 360 unrefused)
    old = {**{k: json.loads(json.dumps(f.default)) for k, f in fields.items()
              if k not in old and f.default is not MISSING}, **old}
    for key in sorted(set(old) & set(new) - {"n_mixtures"}):
        if json.loads(json.dumps(new[key])) != old[key]:  # (tuples as JSON stores them)
            raise BadValue(f"{out} holds mixtures simulated with {key}={old[key]!r} (now {new[key]!r}): simulate "
                           "into another folder, or remove it")
    if "voices" in old and old["voices"] != pool:
        gone, added = sorted(set(old["voices"]) - set(pool)), sorted(set(pool) - set(old["voices"]))
        change = "; ".join(f"{what} {len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                           for what, v in (("without", gone), ("with", added)) if v) or "in another order"
        raise BadValue(f"{out} holds mixtures simulated from other voices than this machine has now ({change}; a "
                       "synthesizer installed or removed since?): simulate into another folder, or remove it")


def mixture_uri(cfg: SimConfig, index: int) -> str:
    room = f"_rt{cfg.rt60[0]:g}-{cfg.rt60[1]:g}" if cfg.rt60 is not None else ""
    count = f"{cfg.min_speakers}-{cfg.n_speakers}" if cfg.min_speakers else f"{cfg.n_speakers}"
    kind = ("_all" if cfg.sources == "all" else "") + ("_aug" if cfg.augment else "") + \
        ("_bk" if cfg.beta_by_count else "")
    if cfg.style == "nonspeech":
        return f"{cfg.split}_nonspeech_{cfg.seed}_{index:05d}"
    if cfg.style == "conversation":
        stretch = f"_st{cfg.stretch_p:g}" if cfg.stretch_p else ""
        return f"{cfg.split}{stretch}_conv_s{count}_{cfg.sources}{'_aug' if cfg.augment else ''}_{cfg.seed}_{index:05d}"
    return f"{cfg.split}_b{cfg.beta:g}_s{count}{kind}{room}_{cfg.seed}_{index:05d}"
