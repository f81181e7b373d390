"""Where the speaker count goes wrong: the shipped pipeline's counts on the dev set, and what could move them.

    python benchmarks/diarize_count.py --data recipe/data --extra .venv/share/normlab/pyannote-sample \
        --out benchmarks/diarize_count.json

``--data`` holds the recipe's held-out sets (``normlab diarize recipe`` makes them, or this script does with
the shipped model's recipe settings where ``--data`` lacks them: about 2 minutes). The dev folders are
segmented once with the shipped settings (about 2 minutes on 2 cores; kept in ``--work`` so a rerun reads them
back), then every reading below clusters and stitches those segmentations again (about a second each):

* the counts: reference speakers against the pipeline's, per file;
* the speakers a wrong count loses: how much reference speech each has;
* the cluster cut and the small-cluster floor around the shipped ones (DER and count right);
* the clusters under the floor when the small ones fold: how many hold a speaker no large cluster holds, and
  how well their centroid's similarity to the nearest large cluster tells those apart (ROC AUC);
* the model's own count: the most local speakers active for at least a second in any one window.

Only the dev set is read: nothing here is scored on a test set.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import pathlib
import time

import numpy as np

DEV = ("dev", "dev_mixed", "dev_synth")


def _eval_sets(data: pathlib.Path) -> None:
    """The recipe's held-out sets in ``data``, simulated with the shipped model's recipe settings where missing."""
    from normlab.diarization.models.eend import model_path
    from normlab.diarization.training.recipe import RecipeConfig, simulate_splits

    if all((data / d / "ref.rttm").is_file() for d in DEV):
        return
    meta = json.loads(pathlib.Path(model_path(None)).with_suffix(".json").read_text())
    simulate_splits(data, RecipeConfig(**meta["config"]), jobs=2, which="eval")


def _labels_before_fold(seg, cfg):
    """The tree's labels at the cut and the cluster floor, as ``cluster`` has them before small clusters fold."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist

    from normlab.diarization.pipeline.stitch import cluster_floor

    x = seg.embeddings.numpy().astype(np.float64)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    tree = linkage(np.nan_to_num(pdist(x, "cosine"), nan=1.0), method="average")
    return x, fcluster(tree, t=cfg.cluster_threshold, criterion="distance"), cluster_floor(seg, cfg)


def _piece_speakers(seg, ref, threshold: float) -> dict:
    """Each embedding row's reference speaker: the one its piece's active frames overlap most."""
    out = {}
    for w, s, a, b, row in seg.pieces:
        t0, t1 = (seg.starts[w] + a) * seg.frame_seconds, (seg.starts[w] + b) * seg.frame_seconds
        if not bool((seg.probs[w, a:b, s] > threshold).any()):
            continue
        overlap = collections.Counter()
        for t in ref:
            overlap[t.speaker] += max(0.0, min(t1, t.start + t.duration) - max(t0, t.start))
        if overlap and max(overlap.values()) > 0:
            out[row] = overlap.most_common(1)[0][0]
    return out


def _voice_of(member: np.ndarray, w: np.ndarray, who: dict):
    """The reference speaker behind most of a cluster's speech (rows ``member``); None where unknown."""
    votes = collections.Counter()
    for r in np.flatnonzero(member):
        votes[who.get(int(r))] += w[r]
    return votes.most_common(1)[0][0]


def small_clusters(segs: dict, refs: dict, cfg) -> list[dict]:
    """Every cluster under the floor at the fold: its speech, its centroid's cosine similarity to the nearest
    large cluster, and whether its main speaker is one no large cluster holds (a voice the fold loses)."""
    out = []
    for uri, seg in segs.items():
        if len(seg.weights) < 2:
            continue
        x, labels, floor = _labels_before_fold(seg, cfg)
        w, who = seg.weights, _piece_speakers(seg, refs[uri], cfg.threshold)
        mass = {k: float(w[labels == k].sum()) for k in np.unique(labels)}
        cent = {k: (c := (x[labels == k] * w[labels == k, None]).sum(0)) / max(np.linalg.norm(c), 1e-12)
                for k in mass}
        voice = {k: _voice_of(labels == k, w, who) for k in mass}
        large = [k for k in mass if mass[k] >= floor]
        held = {voice[k] for k in large}
        for k in mass:
            if mass[k] < floor and large:
                out.append({"uri": uri, "speech_s": mass[k], "new_voice": voice[k] is not None and voice[k] not in held,
                            "similarity": max(float(cent[k] @ cent[j]) for j in large)})
    return out


def auc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC of ``score`` for ``positive`` (ties count half); None without both kinds."""
    pos, neg = score[positive], score[~positive]
    if not len(pos) or not len(neg):
        return None
    return float(np.mean([(p > neg).mean() + 0.5 * (p == neg).mean() for p in pos]))


def model_count(seg, threshold: float, least_s: float = 1.0) -> int:
    """The most local speakers active for at least ``least_s`` seconds in any one window."""
    if seg.probs.numel() == 0:
        return 0
    active_s = (seg.probs > threshold).sum(1).double() * seg.frame_seconds  # windows, local speakers
    return int((active_s >= least_s).sum(1).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="the recipe's data folder (dev, dev_mixed, dev_synth)")
    p.add_argument("--extra", action="append", default=[], help="another dev folder (pyannote's sample)")
    p.add_argument("--work", default=None, help="the segmentations' cache (default: DATA/.count-segments)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()

    from normlab import provenance
    from normlab.diarization.io.audio import recording_uri
    from normlab.diarization.io.rttm import speaker_count
    from normlab.diarization.pipeline.api import load_encoder, load_model
    from normlab.diarization.pipeline.config import PipelineConfig
    from normlab.diarization.pipeline.stitch import stitch
    from normlab.diarization.pipeline.tuning import Segmenter, files_of, measure

    data = pathlib.Path(args.data)
    t0 = time.time()
    _eval_sets(data)
    model = load_model(None)
    cfg = PipelineConfig.for_model(model)
    files = files_of([data / d for d in DEV] + args.extra)
    run = Segmenter(model, {cfg.speaker_encoder: load_encoder(None, cfg.speaker_encoder)}, jobs=2,
                    cache=args.work or data / ".count-segments")
    try:
        segs = run([w for w, _ in files], cfg)
    finally:
        run.close()
    refs = {recording_uri(w): ref for w, ref in files}
    print(f"{len(segs)} dev files segmented in {time.time() - t0:.0f} s")

    counts = collections.Counter((speaker_count(refs[u]), speaker_count(stitch(s, cfg))) for u, s in segs.items())
    lost = []  # the quietest speakers of each file whose count is short
    for uri, seg in segs.items():
        n_hyp, speech = speaker_count(stitch(seg, cfg)), collections.Counter()
        for t in refs[uri]:
            speech[t.speaker] += t.duration
        lost += sorted(speech.values())[: max(0, len(speech) - n_hyp)]
    every = [sum(t.duration for t in ref if t.speaker == s) for ref in refs.values() for s in {t.speaker for t in ref}]
    grid = []
    for cut, floor in itertools.product((0.5, 0.55, 0.6, 0.65), (3.0, 4.0, 6.0, 8.0)):
        m = measure(segs, refs, dataclasses.replace(cfg, cluster_threshold=cut, min_cluster=floor))
        grid.append({"cluster_threshold": cut, "min_cluster": floor, "der_0.25": m["der_0.25"], "der_0": m["der_0"],
                     "count_right": m["count_right"]})
    small = small_clusters(segs, refs, cfg)
    sim = np.array([r["similarity"] for r in small])
    new = np.array([r["new_voice"] for r in small], dtype=bool)
    speech = np.array([r["speech_s"] for r in small])
    by_model = collections.Counter((speaker_count(refs[u]), model_count(s, cfg.threshold)) for u, s in segs.items())
    result = {
        "files": len(segs),
        "shipped": {k: v for k, v in measure(segs, refs, cfg).items() if not k.startswith("_")},
        "counts_ref_hyp": sorted([[r, h, n] for (r, h), n in counts.items()]),
        "under": sum(n for (r, h), n in counts.items() if h < r),
        "over": sum(n for (r, h), n in counts.items() if h > r),
        "lost_speakers": len(lost),
        "lost_speech_s_p10_p50_p90": np.percentile(lost, [10, 50, 90]).round(1).tolist() if lost else None,
        "every_speaker_speech_s_p10_p50_p90": np.percentile(every, [10, 50, 90]).round(1).tolist(),
        "grid": grid,
        "small_clusters": len(small), "small_new_voices": int(new.sum()),
        "auc_low_similarity_new_voice": auc(-sim, new),
        "auc_low_similarity_new_voice_from_2s": auc(-sim[speech >= 2], new[speech >= 2]),
        "model_count_ref_est": sorted([[r, e, n] for (r, e), n in by_model.items()]),
        "model_count_right": sum(n for (r, e), n in by_model.items() if r == e),
        "seconds": round(time.time() - t0, 1),
        "provenance": provenance.record(),
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("grid", "provenance")}, indent=1))
    for row in grid:
        print(row)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
