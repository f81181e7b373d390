"""Turn-taking for simulated conversations (Landini et al. 2022, "From simulated mixtures to simulated conversations").

EEND's mixtures (``simulate.mixture``) lay each speaker's utterances on an
independent timeline, so overlap is as likely in the middle of a turn as at
its end and nobody waits for anybody. Real conversations take turns: one
speaker at a time, a pause or a short overlap where the floor changes, and
short backchannels ("yes", "okay") over someone else's turn. This module
draws that timing; ``simulate.conversation`` fills it with voices.

Per conversation: the probability that a change of speaker overlaps rather
than pauses is drawn from ``p_overlap``, the rate of backchannels from
``backchannel``; each turn is 1-``max_items`` recorded items of one speaker
with short gaps inside. Pauses and overlaps are log-normal (BUT's histograms
of real conversations are long-tailed in the same way), truncated at
``max_gap`` seconds; an overlap never covers more than ``max_overlap_frac``
of either turn, and a speaker never overlaps itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue


@dataclass(frozen=True)
class TurnTaking:
    duration: tuple[float, float] = (20.0, 45.0)  # seconds of conversation to fill (the last turn may run over)
    max_items: int = 4  # recorded items per turn, 1..max_items
    item_gap: tuple[float, float] = (0.05, 0.35)  # seconds between items of one turn
    p_same: float = 0.15  # the next turn is the same speaker's (after a pause)
    p_overlap: tuple[float, float] = (0.2, 0.9)  # per conversation: a speaker change overlaps with this probability
    pause: tuple[float, float] = (0.35, 0.9)  # log-normal median (s) and sigma of a pause at a change
    same_pause: tuple[float, float] = (0.6, 0.8)  # the same speaker's pause between its turns
    overlap: tuple[float, float] = (0.7, 0.7)  # log-normal median (s) and sigma of an overlap at a change
    max_gap: float = 7.0  # pauses and overlaps are truncated here (BUT's histograms stop at 7 s)
    max_overlap_frac: float = 0.8  # an overlap covers at most this much of either turn
    backchannel: tuple[float, float] = (0.1, 0.8)  # per conversation: backchannels per turn
    lead_in: tuple[float, float] = (0.0, 1.5)  # silence before the first turn, seconds


@dataclass(frozen=True)
class Segment:
    speaker: int
    start: float  # seconds
    items: tuple[int, ...]  # indices into that speaker's utterance list, spoken in order
    gaps: tuple[float, ...]  # seconds before each item after the first


def _lognormal(rng: np.random.Generator, median_sigma: tuple[float, float], cap: float) -> float:
    median, sigma = median_sigma
    return float(min(cap, median * np.exp(sigma * rng.standard_normal())))


def schedule(k: int, durations: list[list[float]], short: list[list[int]], cfg: TurnTaking,
             rng: np.random.Generator) -> list[Segment]:
    """Who speaks when: ``Segment``s for ``k`` speakers.

    ``durations[s]`` are the lengths (seconds) of speaker ``s``'s available
    items, consumed in order; ``short[s]`` indexes its backchannel items.
    With ``k == 1`` there are no changes: one speaker's turns with pauses.
    """
    if k < 1:
        raise BadValue(f"need at least one speaker, got {k}")
    target = float(rng.uniform(*cfg.duration))
    p_overlap = float(rng.uniform(*cfg.p_overlap))
    bc_rate = float(rng.uniform(*cfg.backchannel))
    nxt = [0] * k  # next unused item per speaker
    free = [0.0] * k  # when each speaker's last segment ends (nobody overlaps itself)
    used_short: list[set[int]] = [set() for _ in range(k)]
    out: list[Segment] = []

    def take(s: int, n: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
        items, gaps, length = [], [], 0.0
        while len(items) < n and nxt[s] < len(durations[s]):
            i = nxt[s]
            nxt[s] += 1
            if i in used_short[s]:
                continue
            if items:
                g = float(rng.uniform(*cfg.item_gap))
                gaps.append(g)
                length += g
            items.append(i)
            length += durations[s][i]
        return tuple(items), tuple(gaps), length

    t_end = float(rng.uniform(*cfg.lead_in))  # end of the floor holder's last turn
    cur, cur_len = int(rng.integers(k)), 0.0
    first = True

    def unheard() -> list[int]:
        """Speakers with something left to say who have not spoken yet: the conversation goes on past its target
        length until each has had a turn (7-13% of 3-4-speaker conversations ended with one who never spoke,
        so the reference held fewer speakers than were asked for)."""
        spoke = {seg.speaker for seg in out}
        return [j for j in range(k) if j not in spoke and nxt[j] < len(durations[j])]

    while t_end < target or unheard():
        if first:
            s, start = cur, t_end
        elif t_end >= target:  # past the target: the floor goes to one who has not spoken
            waiting = unheard()
            s = waiting[int(rng.integers(len(waiting)))]
            start = t_end + _lognormal(rng, cfg.pause, cfg.max_gap)
        elif k == 1 or rng.random() < cfg.p_same:
            s = cur
            start = t_end + _lognormal(rng, cfg.same_pause, cfg.max_gap)
        else:
            s = int(rng.choice([j for j in range(k) if j != cur]))
            start = None  # decided once the turn's length is known
        items, gaps, length = take(s, int(rng.integers(1, cfg.max_items + 1)))
        if not items:
            if all(nxt[j] >= len(durations[j]) for j in range(k)):
                break  # every speaker has said everything
            cur = s
            continue
        if start is None:
            if rng.random() < p_overlap:
                ov = _lognormal(rng, cfg.overlap, cfg.max_gap)
                ov = min(ov, cfg.max_overlap_frac * min(length, cur_len))
                start = t_end - ov
            else:
                start = t_end + _lognormal(rng, cfg.pause, cfg.max_gap)
        start = max(start, free[s])
        out.append(Segment(s, start, items, gaps))
        free[s] = start + length
        # backchannels from the others while this turn runs
        if k > 1 and length > 1.0:
            for _ in range(int(rng.poisson(bc_rate * length / 3.0))):
                b = int(rng.choice([j for j in range(k) if j != s]))
                choices = [i for i in short[b] if i >= nxt[b] and i not in used_short[b]]
                if not choices:
                    continue
                i = int(choices[int(rng.integers(len(choices)))])
                at = start + float(rng.uniform(0.2, max(0.3, length - durations[b][i])))
                if at < free[b]:
                    continue
                used_short[b].add(i)
                out.append(Segment(b, at, (i,), ()))
                free[b] = at + durations[b][i]
        t_end, cur, cur_len, first = max(t_end, start + length), s, length, False
    return sorted(out, key=lambda seg: seg.start)


def overlap_fraction(intervals: list[list[tuple[float, float]]], step: float = 0.01) -> float:
    """Share of speaker time (summed over speakers) during which two or more speak."""
    end = max((b for spk in intervals for _, b in spk), default=0.0)
    n = int(np.ceil(end / step)) + 1
    count = np.zeros(n, np.int32)
    for spk in intervals:
        active = np.zeros(n, bool)
        for a, b in spk:
            active[int(a / step) : int(b / step)] = True
        count += active
    total = count.sum()
    return float(count[count >= 2].sum() / total) if total else 0.0


BACKCHANNELS = ("yes", "yeah", "okay", "right", "no", "sure", "uh huh", "mm hmm", "really", "exactly", "I see")


@dataclass(frozen=True)
class Channel:
    """The recording: rooms (some with the microphone metres away), noise of five kinds, telephone, level."""

    room_p: float = 0.6  # probability that a conversation is in a room
    far_p: float = 0.5  # of those, probability that the microphone is far (reverberant tail >= direct path)
    rt60: tuple[float, float] = (0.2, 0.9)
    noise_p: tuple[float, ...] = (0.15, 0.2, 0.1, 0.3, 0.25)  # white, pink, brown, babble, music
    snr_db: tuple[float, float] = (3.0, 30.0)
    telephone_p: float = 0.2
    peak_db: tuple[float, float] = (-26.0, -1.0)


NOISE_KINDS = ("white", "pink", "brown", "babble", "music")


def utterances(voice, n: int, rng: np.random.Generator, sample_rate: int) -> tuple[list[np.ndarray], list[int]]:
    """``n`` utterances of ``voice`` as one speaker of a conversation, and which of them are backchannels.

    A recorded person (``voice.synth == "recorded"``) or a neural voice (``"neural"``:
    its bank of synthesized sentences, ``neural.bank``): ``n`` of its prompts in
    random order, all played at one speed (0.9-1.1: that speaker's own
    tempo and pitch). A synthesizer voice: ``n`` sentences of random words and a
    few one-word backchannels at one F0 and rate.
    """
    from . import augment as aug
    from .prompts import SHORT, prompts
    from .voices import synthesize

    if voice.synth in ("recorded", "neural"):
        if voice.synth == "recorded":
            pool = prompts(voice.name, sample_rate)
        else:
            from .neural import bank

            pool = bank(voice.name, sample_rate)
        factor = float(rng.uniform(0.9, 1.1))
        idx = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
        utts = [aug.speed(pool[int(i)], factor) for i in idx]
    else:
        from .simulate import _words

        f0, rate = float(rng.uniform(*voice.f0)), float(rng.uniform(0.85, 1.2))
        n_bc = max(1, n // 5)
        texts = [_words(rng, 3, 10) for _ in range(n - n_bc)]
        texts += [str(rng.choice(BACKCHANNELS)) for _ in range(n_bc)]
        utts = synthesize(voice, texts, f0, rate, sample_rate)
        order = rng.permutation(len(utts))
        utts = [utts[int(i)] for i in order]
    short = [i for i, u in enumerate(utts) if len(u) < SHORT * sample_rate]
    return utts, short
