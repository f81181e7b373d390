"""Real-time factor and peak memory of `normlab.diarization.diarize` on a long recording (default 1 hour).

The recording is the pyannote sample (``make sample``) repeated to the length asked, written as a 16 kHz WAV;
the pipeline runs in this process with 2 torch threads. Writes benchmarks/diarize_long.json.

    python benchmarks/diarize_long.py [--minutes 60]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import sys
import tempfile
import time

import soundfile as sf
import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).with_name("diarize_long.json")))
    args = ap.parse_args()
    sample = pathlib.Path(sys.prefix) / "share" / "normlab" / "pyannote-sample" / "sample.wav"
    if not sample.is_file():
        print(f"error: {sample} is missing (make sample)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    from normlab import __version__
    from normlab.diarization import diarize

    wav, sr = sf.read(sample, dtype="float32")
    n = int(args.minutes * 60 * sr)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "long.wav"
        with sf.SoundFile(path, "w", sr, 1) as f:  # written in pieces: the benchmark itself stays small
            left = n
            while left > 0:
                f.write(wav[: min(left, len(wav))])
                left -= min(left, len(wav))
        del wav
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0, c0 = time.perf_counter(), time.process_time()
        turns = diarize(path)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "audio_seconds": n / sr, "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
        "rtf": round(wall / (n / sr), 4), "peak_rss_mb": round(peak), "rss_before_mb": round(base),
        "turns": len(turns), "speakers": len({t.speaker for t in turns}), "threads": args.threads,
        "settings": turns.settings, "provenance": turns.provenance,  # what made the number
        "versions": {"normlab": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_1min": round(os.getloadavg()[0], 1)},
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
