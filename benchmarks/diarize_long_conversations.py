"""The cluster floor on long conversations: held-out 2-6 minute conversations of 2-4 distinct persons, read with
the shipped pipeline at each ``min_cluster_share``.

    python benchmarks/diarize_long_conversations.py --work recipe/long \
        --out benchmarks/diarize_long_conversations.json

The recipe's mixed dev and test sets (real persons and synthesizer voices, each recording's speakers distinct
persons), simulated again as longer conversations: ``SimConfig(duration=(120, 360))``, 2-4 speakers, seed 11,
``--n`` recordings per set. Each recording is segmented once (the shipped model and settings); the clustering
then runs at every share of ``--shares``, with everything else as shipped. The share is chosen on the dev set
(with the short dev sets, docs/diarization.md), the test set is read once at the choice; both are printed
here so that the docs' table can be rebuilt.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import time


def long_sets(work: pathlib.Path, names: list[str], n: int, duration: tuple[float, float], jobs: int) -> dict:
    """``{name: folder}``: each of the recipe's sets ``names`` simulated again as ``n`` long conversations."""
    from normlab.diarization.data.simulate import simulate
    from normlab.diarization.training.recipe import RecipeConfig, _splits

    sims = dict(_splits(RecipeConfig()))
    out = {}
    for name in names:
        sim = dataclasses.replace(sims[name], n_mixtures=n, n_speakers=4, min_speakers=2, seed=11, duration=duration)
        out[name] = simulate(work / name, sim, jobs=jobs)
    return out


def read(segs: dict, refs: dict, cfg) -> dict:
    """``tuning.measure``'s numbers and the (reference, found) speaker counts of one setting."""
    from normlab.diarization.pipeline.stitch import stitch
    from normlab.diarization.pipeline.tuning import measure

    m = measure(segs, refs, cfg)
    counts = collections.Counter()
    for uri, seg in segs.items():
        counts[f"{len({t.speaker for t in refs[uri]})}->{len({t.speaker for t in stitch(seg, cfg)})}"] += 1
    return {**m, "counts": dict(sorted(counts.items()))}


def main() -> None:
    from normlab.diarization.pipeline.api import _prepare
    from normlab.diarization.pipeline.tuning import Segmenter, files_of, share_better

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="recipe/long", help="where the long conversations are simulated")
    p.add_argument("--sets", default="dev_mixed,test_mixed", help="the recipe's sets to simulate long")
    p.add_argument("--n", type=int, default=18, help="recordings per set")
    p.add_argument("--duration", type=float, nargs=2, default=(120.0, 360.0), metavar=("MIN", "MAX"))
    p.add_argument("--shares", default="0,0.02,0.03,0.04,0.05,0.06,0.08", help="min_cluster_share values to read")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args()
    folders = long_sets(pathlib.Path(a.work), a.sets.split(","), a.n, tuple(a.duration), a.jobs)
    model, encoder, cfg, _, _ = _prepare(None, None, None, None, None, {})
    segmenter, result = Segmenter(model, encoder, jobs=a.jobs), {}
    try:
        for name, folder in folders.items():
            t = time.time()
            files = files_of([folder])
            segs, refs = segmenter([w for w, _ in files], cfg), {w.stem: r for w, r in files}
            base = None
            for share in map(float, a.shares.split(",")):
                m = read(segs, refs, dataclasses.replace(cfg, min_cluster_share=share))
                base = base or m
                row = {k: v for k, v in m.items() if not k.startswith("_")}
                row["lower_than_first_share"] = share_better(m["_files"], base["_files"])
                result[f"{name}/{share:g}"] = row
                print(f"{name} share {share:g}", json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                                             for k, v in row.items()}), flush=True)
            print(f"{name}: {len(files)} recordings, {time.time() - t:.0f} s", flush=True)
    finally:
        segmenter.close()
    if a.out:
        from normlab import provenance
        from normlab.diarization.models.eend import SHIPPED
        from normlab.diarization.models.weights import sha256

        made = {"sets": a.sets, "n": a.n, "duration": list(a.duration), "seed": 11, "model_sha256": sha256(SHIPPED),
                "settings": dataclasses.asdict(cfg), "provenance": provenance.record()}
        pathlib.Path(a.out).write_text(json.dumps({**made, "results": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
