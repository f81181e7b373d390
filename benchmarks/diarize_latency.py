"""Latency of ``normlab diarize`` on a 30 s recording, 2 cores: the whole command and its stages.

    .venv/bin/python benchmarks/diarize_latency.py [--audio FILE] [--repeats 5]

Without ``--audio`` it simulates one test-split mixture (espeak-ng) and cuts
its first 30 s. "command" is the wall time of a fresh ``normlab diarize``
process (Python and torch start-up included), the number a user waits; the
pipeline's stages (loading the model and the speaker encoder, reading the
audio, segmentation: the EEND model over its windows and the speaker
embeddings, then clustering and stitching) are timed in this process after
one warm-up, with the settings ``normlab diarize`` uses. Medians of ``repeats``.
Writes benchmarks/diarize_latency.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import soundfile as sf
import torch

from normlab.diarization.io.audio import SAMPLE_RATE, read_mono
from normlab.diarization.pipeline.api import load_encoder, load_model
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.segment import segment
from normlab.diarization.pipeline.stitch import stitch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def thirty_seconds(folder: pathlib.Path) -> pathlib.Path:
    from normlab.diarization.data.simulate import SimConfig, simulate

    sim = simulate(folder / "sim", SimConfig(n_mixtures=1, split="test", seed=99))
    wav = next((sim / "wav").glob("*.wav"))
    audio, sr = sf.read(wav, dtype="float32")
    out = folder / "thirty.wav"
    sf.write(out, audio[: 30 * sr], sr)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--audio", help="a recording (default: 30 s of a simulated test mixture)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        audio = pathlib.Path(args.audio) if args.audio else thirty_seconds(tmp)
        seconds = sf.info(str(audio)).duration
        exe = pathlib.Path(sys.executable).parent / "normlab"
        command = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([str(exe), "diarize", str(audio), "--out", str(tmp / "rttm")], check=True,
                           capture_output=True)
            command.append(time.perf_counter() - t0)
        stages: dict[str, list[float]] = {"load model and encoder": [], "read audio": [],
                                          "segment (model, embeddings)": [], "cluster and stitch": []}
        for i in range(args.repeats + 1):
            t = [time.perf_counter()]
            model = load_model()
            cfg = PipelineConfig.for_model(model)
            encoder = load_encoder(None, cfg.speaker_encoder)
            t.append(time.perf_counter())
            wave = read_mono(audio, SAMPLE_RATE)
            t.append(time.perf_counter())
            with torch.no_grad():
                seg = segment(model, encoder, wave, audio.stem, cfg)
            t.append(time.perf_counter())
            stitch(seg, cfg)
            t.append(time.perf_counter())
            if i:  # the first pass warms up
                for k, name in enumerate(stages):
                    stages[name].append(t[k + 1] - t[k])
    result = {"audio_seconds": round(seconds, 2), "threads": 2, "repeats": args.repeats,
              "command_s": round(statistics.median(command), 3),
              "stages_ms": {k: round(1e3 * statistics.median(v), 1) for k, v in stages.items()}}
    (ROOT / "benchmarks" / "diarize_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"normlab diarize on {seconds:.1f} s of audio: {result['command_s']:.2f} s wall (fresh process, median of "
          f"{args.repeats})")
    for k, v in result["stages_ms"].items():
        print(f"  {k:<28s} {v:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
