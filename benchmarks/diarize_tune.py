"""Choose the pipeline's settings on a development set; score a held-out set once with the choice.

    python benchmarks/diarize_tune.py --model MODEL --dev DIR[,DIR...] [--test DIR,...] --out tune.json \
        [--grid NAME=V1,V2 ...]

Each DIR holds ``wav/*.wav`` and ``ref.rttm`` (a ``normlab diarize simulate`` folder, or real recordings laid
out the same way). Segmentation (model + VAD + embeddings) runs once per (mode, window step) and file; the
clustering and stitching settings are a grid over those segmentations. The dev choice minimises total DER at
collar 0.25 over every dev file together; the test sets are then scored with it alone. Besides DER, the table
gives the share of files whose speaker count is right and the overlap precision (of the frames the pipeline
calls overlap, the share that are overlap in the reference).
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import time

import numpy as np
import torch

from normlab.diarization.io.audio import SAMPLE_RATE, read_mono
from normlab.diarization.io.rttm import read_rttm
from normlab.diarization.metrics.der import score
from normlab.diarization.pipeline.api import load_encoder, load_model
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.stitch import segment, stitch

SEGMENT_GRID = {"speakers": ("eend", "speech"), "vad": ("gate", "off", "speech"), "threshold": (0.3, 0.4, 0.5),
                "step": (5.0, 2.5)}
STITCH_GRID = {"cluster_threshold": (0.2, 0.3, 0.4, 0.5), "min_cluster": (2.0, 4.0, 8.0),
               "weighting": ("mean", "hamming"), "overlap_threshold": (0.5, 0.6, 0.7, 0.8)}


def meaningful(kw: dict) -> bool:
    """False for settings the pipeline ignores in that mode (they would repeat another row)."""
    if kw.get("speakers") == "eend" and kw.get("vad") == "speech":
        return False  # "speech" is a speech-mode reading; eend mode gates with the VAD instead
    if kw.get("speakers") == "speech" and kw.get("overlap_threshold", STITCH_GRID["overlap_threshold"][0]) != \
            STITCH_GRID["overlap_threshold"][0]:
        return False  # one speaker at a time: no second speaker to threshold
    return True


def parse_grid(items: list[str]) -> None:
    """``NAME=V1,V2`` replaces that axis of SEGMENT_GRID or STITCH_GRID."""
    for item in items:
        name, _, values = item.partition("=")
        grid = SEGMENT_GRID if name in SEGMENT_GRID else STITCH_GRID if name in STITCH_GRID else None
        if grid is None or not values:
            raise SystemExit(f"--grid {item!r}: expected NAME=V1,V2 with NAME one of "
                             f"{sorted([*SEGMENT_GRID, *STITCH_GRID])}")
        kind = type(grid[name][0])
        grid[name] = tuple(kind(v) for v in values.split(","))


def files_of(dirs: list[str]) -> list[tuple[pathlib.Path, list]]:
    out = []
    for d in dirs:
        ref = read_rttm(pathlib.Path(d) / "ref.rttm")
        out += [(w, ref.get(w.stem, [])) for w in sorted((pathlib.Path(d) / "wav").glob("*.wav")) if w.stem in ref]
    return out


def overlap_precision(ref, hyp, step: float = 0.01) -> tuple[float, float]:
    """(frames the hypothesis calls overlap that are reference overlap, frames it calls overlap)."""
    end = max([t.start + t.duration for t in ref + hyp], default=0.0)
    n = int(end / step) + 1

    def counts(turns):
        c = np.zeros(n, np.int16)
        for spk in {t.speaker for t in turns}:
            a = np.zeros(n, bool)
            for t in turns:
                if t.speaker == spk:
                    a[int(t.start / step) : int((t.start + t.duration) / step)] = True
            c += a
        return c

    r, h = counts(ref), counts(hyp)
    return float(((h >= 2) & (r >= 2)).sum()), float((h >= 2).sum())


def measure(segs: dict, refs: dict, cfg: PipelineConfig) -> dict:
    hyp = {uri: stitch(s, cfg) for uri, s in segs.items()}
    out = {f"der_{c:g}": score(refs, hyp, collar=c).der for c in (0.25, 0.0)}
    r = score(refs, hyp, collar=0.0)
    out.update({k: getattr(r, k) / r.total for k in ("missed", "false_alarm", "confusion")})
    out["count_right"] = float(np.mean([len({t.speaker for t in hyp[u]}) == len({t.speaker for t in refs[u]})
                                        for u in refs]))
    hit, called = map(sum, zip(*(overlap_precision(refs[u], hyp[u]) for u in refs)))
    out["overlap_precision"] = hit / called if called else float("nan")
    out["overlap_called_s"] = called * 0.01
    return out


def run(model_path, dev: list[str], test: list[str], extra: dict | None = None) -> dict:
    model, encoder = load_model(model_path), load_encoder()
    sets = {"dev": files_of(dev), **{f"test:{t}": files_of([t]) for t in test}}
    waves = {name: [(w.stem, read_mono(w, SAMPLE_RATE), ref) for w, ref in fs] for name, fs in sets.items()}
    rows, t0 = [], time.time()
    for seg_kw in (dict(zip(SEGMENT_GRID, v)) for v in itertools.product(*SEGMENT_GRID.values())):
        if not meaningful(seg_kw):
            continue
        base = PipelineConfig.for_model(model, **seg_kw, **(extra or {}))
        segs = {uri: segment(model, encoder, w, uri, base) for uri, w, _ in waves["dev"]}
        refs = {uri: ref for uri, _, ref in waves["dev"]}
        for st_kw in (dict(zip(STITCH_GRID, v)) for v in itertools.product(*STITCH_GRID.values())):
            if not meaningful({**seg_kw, **st_kw}):
                continue
            cfg = PipelineConfig.for_model(model, **seg_kw, **st_kw, **(extra or {}))
            rows.append({**seg_kw, **st_kw, **measure(segs, refs, cfg)})
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}),
                  f"{time.time() - t0:.0f}s", flush=True)
    keys = (*SEGMENT_GRID, *STITCH_GRID)
    best = min(rows, key=lambda r: r["der_0.25"])
    chosen = {k: best[k] for k in keys}
    vad_rows = [r for r in rows if r["vad"] == "speech"]  # the comparison: Silero alone decides speech
    vad_best = min(vad_rows, key=lambda r: r["der_0.25"]) if vad_rows else None
    result = {"model": str(model_path), "dev": dev, "dev_files": len(waves["dev"]), "grid": rows, "chosen": chosen,
              "dev_best": best, "dev_vad_speech_best": vad_best}
    readings = {"chosen": chosen, **({"vad_speech": {k: vad_best[k] for k in keys}} if vad_best else {})}
    for name in sets:
        if name.startswith("test:"):  # scored once per reading, with the dev choice
            refs = {uri: ref for uri, _, ref in waves[name]}
            result[name] = {}
            for reading, kw in readings.items():
                cfg = PipelineConfig.for_model(model, **kw, **(extra or {}))
                segs = {uri: segment(model, encoder, w, uri, cfg) for uri, w, _ in waves[name]}
                result[name][reading] = measure(segs, refs, cfg)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model file (default: the shipped one)")
    ap.add_argument("--dev", required=True, help="comma-separated development folders")
    ap.add_argument("--test", default="", help="comma-separated held-out folders, scored once with the dev choice")
    ap.add_argument("--out", default="tune.json", help="where the grid, the choice and the test scores go")
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                    help="replace one axis of the grid (repeatable), e.g. --grid vad=gate,off")
    args = ap.parse_args()
    parse_grid(args.grid)
    torch.set_grad_enabled(False)
    result = run(args.model, args.dev.split(","), [t for t in args.test.split(",") if t])
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("chosen:", result["chosen"], "dev:", {k: round(v, 4) for k, v in result["dev_best"].items()
                                                 if isinstance(v, float)})


if __name__ == "__main__":
    main()
