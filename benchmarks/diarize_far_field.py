"""The pipeline on held-out conversations moved into a far room (or through another channel): default
against ``--vad speech``.

    python benchmarks/diarize_far_field.py --data recipe/data --sets dev,dev_mixed,test,test_mixed \
        --work recipe/far --out benchmarks/diarize_far_field.json
    python benchmarks/diarize_far_field.py --data recipe/data --sets dev --vad "" --channel telephone \
        --work recipe/telephone

Each recording of each folder gets a second room on top of its own channel
(a synthetic impulse response, RT60 0.5-0.9 s, the reverberant tail 1.5-2x
the direct path: a microphone metres away), colored noise at 5-15 dB SNR and
a peak level of -30 to -6 dBFS, drawn per file from ``--seed`` (the same
copy on every run); the reference turns stay as they are. Then the shipped
pipeline reads the copies as a user would (``normlab diarize evaluate``):
its defaults (the model decides speech) and each ``--vad`` mode named. Its
settings are the model file's, chosen on the clean dev set: nothing here is
tuned on these copies.

``--channel`` puts the copies through another channel instead of the room
(the same for every file, no draw): ``telephone`` (8 kHz, a 4th-order
300-3400 Hz band-pass, the peak at 0.7, 8-bit mu-law), ``radio`` (a 150-3800
Hz band-pass and tanh saturation), ``quiet`` (30 dB down) or ``clipped``
(20 dB up, clipped at half scale).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import time

import numpy as np


def far_copy(src: pathlib.Path, dst: pathlib.Path, seed: int) -> pathlib.Path:
    """``dst/wav/*.wav`` and ``dst/ref.rttm``: every ``src/wav/*.wav`` in a far room, noisy (module doc)."""
    import soundfile as sf

    from normlab.diarization.data import augment as aug

    (dst / "wav").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "ref.rttm", dst / "ref.rttm")
    for i, wav in enumerate(sorted((src / "wav").glob("*.wav"))):
        rng = np.random.default_rng([seed, i])
        x, sr = sf.read(wav, dtype="float32")
        y = aug.reverberate(x, float(rng.uniform(0.5, 0.9)), sr, rng, float(rng.uniform(1.5, 2.0)))
        noise = aug.colored_noise(("white", "pink", "brown")[int(rng.integers(3))], len(y), rng)
        y = aug.gain(aug.add_noise(y, noise, float(rng.uniform(5, 15))), float(rng.uniform(-30, -6)))
        sf.write(dst / "wav" / wav.name, y, sr, subtype="PCM_16")
    return dst


CHANNELS = ("far", "telephone", "radio", "quiet", "clipped")


def channel(x: np.ndarray, sr: int, kind: str) -> tuple[np.ndarray, int]:
    """``x`` (float32 mono at ``sr``) through ``kind`` (module doc): samples and their rate."""
    from scipy.signal import butter, resample_poly, sosfilt

    if kind == "telephone":
        y = resample_poly(x, 8000, sr) if sr != 8000 else x
        y = sosfilt(butter(4, [300, 3400], "bandpass", fs=8000, output="sos"), y)
        y = y / (np.abs(y).max() + 1e-9) * 0.7
        mu = 255
        code = np.round(np.sign(y) * np.log1p(mu * np.abs(y)) / np.log1p(mu) * 127) / 127  # 8 bits
        return np.sign(code) * ((1 + mu) ** np.abs(code) - 1) / mu, 8000
    if kind == "radio":
        y = sosfilt(butter(4, [150, 3800], "bandpass", fs=sr, output="sos"), x)
        return np.tanh(4 * y / (np.abs(y).max() + 1e-9)) * 0.5, sr
    if kind == "quiet":
        return x * 10 ** (-30 / 20), sr
    if kind == "clipped":
        return np.clip(x * 10 ** (20 / 20), -0.5, 0.5), sr
    raise ValueError(f"unknown channel {kind!r}")


def channel_copy(src: pathlib.Path, dst: pathlib.Path, kind: str) -> pathlib.Path:
    """``dst/wav/*.wav`` and ``dst/ref.rttm``: every ``src/wav/*.wav`` through the channel ``kind``."""
    import soundfile as sf

    (dst / "wav").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "ref.rttm", dst / "ref.rttm")
    for wav in sorted((src / "wav").glob("*.wav")):
        x, sr = sf.read(wav, dtype="float32")
        y, rate = channel(x, sr, kind)
        sf.write(dst / "wav" / wav.name, y.astype(np.float32), rate)
    return dst


def summary(result: dict) -> dict:
    """DER at both collars with its parts (shares of the scored time) and the share of files whose speaker
    count is right (``evaluate_folder``'s count)."""
    out = {}
    for c in ("0.25", "0"):
        tot = result["total"][c]
        out[f"der_{c}"] = tot["der"]
        out.update({f"{k}_{c}": tot[k] / tot["total"] for k in ("missed", "false_alarm", "confusion")})
    out["count_right"] = result["count_right"] / len(result["files"])
    return out


def main() -> None:
    from normlab.diarization.metrics.evaluate import evaluate_folder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="recipe/data", help="the recipe's data folder")
    p.add_argument("--sets", default="dev,dev_mixed,test,test_mixed", help="comma-separated folders under --data")
    p.add_argument("--vad", default="speech", help="comma-separated --vad modes to read beside the default")
    p.add_argument("--seed", type=int, default=1, help="the far rooms' and noises' seed")
    p.add_argument("--channel", default="far", choices=CHANNELS, help="the far room, or another channel")
    p.add_argument("--work", default="recipe/far", help="where the copies and the RTTMs go")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args()
    work, result = pathlib.Path(a.work), {}
    for k, s in enumerate(a.sets.split(",")):
        folder = (far_copy(pathlib.Path(a.data) / s, work / s, a.seed + k) if a.channel == "far" else
                  channel_copy(pathlib.Path(a.data) / s, work / s, a.channel))
        for vad in ["default", *filter(None, a.vad.split(","))]:
            t = time.time()
            kw = {} if vad == "default" else {"vad": vad}
            res = evaluate_folder(folder / "wav", folder / "ref.rttm", work / f"rttm_{s}_{vad}", overwrite=True, **kw)
            row = result[f"{s}/{vad}"] = {**summary(res), "seconds": round(time.time() - t, 1)}
            print(f"{s}/{vad}", json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
    if a.out:
        from normlab import provenance
        from normlab.diarization.models.eend import SHIPPED
        from normlab.diarization.models.weights import sha256

        made = {"seed": a.seed, "channel": a.channel, "sets": a.sets, "vad": a.vad, "model_sha256": sha256(SHIPPED),
                "provenance": provenance.record()}
        pathlib.Path(a.out).write_text(json.dumps({**made, "results": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
