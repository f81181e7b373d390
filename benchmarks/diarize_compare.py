"""Two diarization model files on the recipe's held-out folders: local (per-window) DER and pipeline DER.

    python benchmarks/diarize_compare.py --old OLD.pt --new recipe/model.pt --data recipe/data \
        --sets test,test_dry --out benchmarks/diarize_compare.json

For each model and folder: the local DER (``windows.py``: each 10 s window
scored on its own, with the model's post-processing), and the DER of the
full pipeline (``normlab diarize evaluate``: windows, speaker embeddings,
clustering, stitching), in total and by the number of speakers per
recording. Collars 0.25 s and 0. One thread, as the shipped numbers.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch


def compare(models: dict[str, str], data: pathlib.Path, sets: list[str], work: pathlib.Path) -> dict:
    from normlab.diarization.io.rttm import read_rttm
    from normlab.diarization.metrics.evaluate import evaluate, evaluate_folder
    from normlab.diarization.metrics.windows import window_probs
    from normlab.diarization.models.eend import EENDModel

    out = {}
    for name, path in models.items():
        model = EENDModel.load(path)
        for s in sets:
            folder, key, t = data / s, f"{name}/{s}", time.time()
            ref = read_rttm(folder / "ref.rttm")
            row = out[key] = {"model": str(path), "local_speakers": model.cfg.n_speakers}
            probs, refs = window_probs(model, folder, 100)
            for c in (0.25, 0.0):
                r = evaluate(probs, refs, collar=c, **model.postprocess)
                row[f"local_{c:g}"] = {"der": r.der, "false_alarm": r.false_alarm / r.total,
                                       "missed": r.missed / r.total, "confusion": r.confusion / r.total}
            res = evaluate_folder(folder / "wav", folder / "ref.rttm", work / f"{name}_{s}", model=model)
            for c in ("0.25", "0"):
                tot = res["total"][c]
                row[f"pipeline_{c}"] = {k: tot[k] / tot["total"] if k != "der" else tot[k]
                                        for k in ("der", "false_alarm", "missed", "confusion")}
            by_n: dict[int, list] = {}
            for f in res["files"]:
                by_n.setdefault(len({t.speaker for t in ref[f["uri"]]}), []).append(f["collars"]["0.25"])
            row["pipeline_0.25_by_speakers"] = {
                n: sum(x["false_alarm"] + x["missed"] + x["confusion"] for x in v) / sum(x["total"] for x in v)
                for n, v in sorted(by_n.items())}
            row["seconds"] = round(time.time() - t, 1)
            print(key, json.dumps({k: (v["der"] if isinstance(v, dict) and "der" in v else v)
                                   for k, v in row.items()}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="a model file")
    p.add_argument("--new", required=True, help="another model file")
    p.add_argument("--data", default="recipe/data", help="the recipe's data folder")
    p.add_argument("--sets", default="test,test_dry", help="comma-separated folders under --data")
    p.add_argument("--work", default="recipe/compare", help="where the pipeline's RTTMs go")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args()
    torch.set_num_threads(1)
    result = compare({"old": a.old, "new": a.new}, pathlib.Path(a.data), a.sets.split(","), pathlib.Path(a.work))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
