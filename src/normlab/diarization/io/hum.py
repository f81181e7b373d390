"""Mains hum: found in a recording's long-term spectrum, notched out before anything reads the signal.

A recording made near mains wiring can carry a steady 50 or 60 Hz tone and
its harmonics. Speech never holds one frequency for minutes, so in the
spectrum of the first minutes at 1 Hz resolution hum stands out as narrow
peaks far above their neighbourhood. The speaker encoder's lowest mel bands
read hum in every piece: at -35 dBFS (50 + 150 Hz) it took the dev set's DER
from 21.0% to 22.4% and merged the two speakers of pyannote.audio's sample.

``find_hum`` calls a mains frequency hum when its fundamental stands
``FUNDAMENTAL_DB`` above the median of the bins around it; on the dev, test
and training conversations (no hum added) no fundamental stood more than
14 dB above them, and the added hum 36-78 dB. ``remove_hum`` then notches
that fundamental and each harmonic that stands ``HARMONIC_DB`` out.
"""
from __future__ import annotations

import numpy as np

MAINS_HZ = (50, 60)
FUNDAMENTAL_DB = 20.0  # the fundamental's peak over its neighbourhood that calls hum
HARMONIC_DB = 10.0  # a harmonic notched when it stands this far out
MAX_HARMONIC = 10  # harmonics considered: up to 500 / 600 Hz
LOOK_SECONDS = 300  # the spectrum is measured on this much of the recording's start
NOTCH_Q = 30.0  # notch quality: about 1.7 Hz wide at 50 Hz
WARM_SECONDS = 2  # the filters settle on this much of the start before they run (remove_hum)


def _prominence(db: np.ndarray, hz: int) -> float:
    """dB of the 1 Hz bin at ``hz`` (or a neighbour) over the median of the bins 4-12 Hz around it."""
    peak = db[hz - 1 : hz + 2].max()
    ring = np.r_[db[hz - 12 : hz - 3], db[hz + 4 : hz + 13]]
    return float(peak - np.median(ring))


def find_hum(mono: np.ndarray, sample_rate: int) -> list[int]:
    """Frequencies (Hz) to notch in ``mono``: a mains fundamental that stands out and its harmonics that do;
    empty where there is no hum (or the recording is shorter than 2 s)."""
    from scipy.signal import welch

    x = mono[: LOOK_SECONDS * sample_rate]
    if x.size < 2 * sample_rate:
        return []
    _, psd = welch(x, sample_rate, nperseg=sample_rate, noverlap=sample_rate // 2)  # 1 Hz bins
    db = 10 * np.log10(psd.astype(np.float64) + 1e-20)
    nyquist = sample_rate // 2
    found = []
    for f0 in MAINS_HZ:
        if f0 + 13 >= nyquist or _prominence(db, f0) < FUNDAMENTAL_DB:
            continue
        found += [k * f0 for k in range(1, MAX_HARMONIC + 1) if k * f0 + 13 < nyquist and
                  (k == 1 or _prominence(db, k * f0) >= HARMONIC_DB)]
    return sorted(set(found))


def remove_hum(mono: np.ndarray, sample_rate: int, block: int) -> list[int]:
    """Notch ``find_hum``'s frequencies out of ``mono`` in place, ``block`` samples at a time with the filters'
    state carried; returns them (empty: ``mono`` untouched)."""
    from scipy.signal import iirnotch, sosfilt, tf2sos

    freqs = find_hum(mono, sample_rate)
    if not freqs:
        return freqs
    # in float64: a notch's poles lie within 1e-5 of the unit circle at high rates, and rounded to float32 they
    # moved it off the hum (at 192 kHz the hum was barely lowered; at 768 kHz it came out 15 dB louder)
    sos = np.concatenate([tf2sos(*iirnotch(f, NOTCH_Q, fs=sample_rate)) for f in freqs])
    # the filters start settled on the hum: their state after the first whole seconds (a whole number of periods
    # of every mains harmonic, at any integer rate) is the state the hum's steady run has at the start. From rest,
    # the hum faded out over the first 1.2 s, and the model heard that fade as speech (a turn at 0.0-0.6 s)
    warm = min(mono.size, WARM_SECONDS * sample_rate) // sample_rate * sample_rate
    state = sosfilt(sos, mono[:warm].astype(np.float64), zi=np.zeros((sos.shape[0], 2)))[1]
    for i in range(0, mono.size, block):
        mono[i : i + block], state = sosfilt(sos, mono[i : i + block].astype(np.float64), zi=state)
    return freqs
