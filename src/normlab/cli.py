"""Command line: ``normlab SUBCOMMAND``. Thin: parse, call the library, print."""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys


def _cmd_lesson(args: argparse.Namespace) -> int:
    from .lesson import LessonConfig, format_lesson, run_lesson

    cfg = LessonConfig(batch=args.batch, tokens=args.tokens, d_model=args.d_model, seed=args.seed)
    result = run_lesson(cfg)
    print(json.dumps(result, indent=2) if args.json else format_lesson(result))
    return 0 if result["passed"] else 1


def _progress(i: int, n: int, label: str) -> None:
    print(f"\r[{i + 1}/{n}] {label:<48s}", end="", file=sys.stderr, flush=True)


def _shape(text: str) -> tuple[int, int]:
    try:
        n, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 8192x768, got {text!r}") from None
    return n, d


def _cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from . import bench

    torch.set_num_threads(args.threads)
    result = bench.run(args.ops, args.shapes, args.dtypes, repeats=args.repeats, progress=_progress)
    print(file=sys.stderr)
    result["cold_start_s"] = bench.cold_start_seconds() if args.cold_start else None
    table = bench.markdown(result)
    print(table)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    (out / "bench.md").write_text(table + "\n")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}", file=sys.stderr)
    return 0


def _cmd_count(args: argparse.Namespace) -> int:
    from .accounting import count_preset, format_count

    result = count_preset(args.preset)
    print(json.dumps(result, indent=2) if args.json else format_count(result))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .studies.report import run_studies, study_tables, verdict_table

    scale = "quick" if args.quick else "full"
    result = run_studies(args.out, scale=scale, jobs=args.jobs, only=args.only)
    print(verdict_table(result))
    tables = study_tables(result)
    if tables:
        print("\n" + tables)
    print(f"wrote {args.out}/index.html, {args.out}/results.json, {args.out}/runs.sqlite ({result['seconds']} s)")
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    args.only = [args.name]
    return _cmd_report(args)


def _read_rttms(paths: list[str]) -> dict:
    """Turns of RTTM files and of every ``*.rttm`` in folders, by recording."""
    from .diarization.rttm import read_rttm

    turns: dict = {}
    for path in map(pathlib.Path, paths):
        files = sorted(path.glob("*.rttm")) if path.is_dir() else [path]
        if not files:
            raise SystemExit(f"error: {path} has no .rttm files")
        for f in files:
            for uri, ts in read_rttm(f).items():
                turns.setdefault(uri, []).extend(ts)
    return turns


def _cmd_diarize_score(args: argparse.Namespace) -> int:
    from .diarization.der import score
    from .diarization.rttm import read_uem

    ref, hyp = _read_rttms([args.ref]), _read_rttms(args.hyp)
    uem = read_uem(args.uem) if args.uem else None
    result = score(ref, hyp, collar=args.collar, skip_overlap=args.skip_overlap, uem=uem)
    print(result.format())
    print(f"  recordings: {len(ref)}; collar {args.collar:g} s each side of reference boundaries"
          f"{'; overlap skipped' if args.skip_overlap else ''}")
    return 0


def _cmd_diarize_run(args: argparse.Namespace) -> int:
    from .diarization.infer import diarize_files
    from .diarization.model import EENDModel

    model = EENDModel.load(args.model)  # None: the model shipped in the package
    post = {k: v for k, v in (("threshold", args.threshold), ("median", args.median)) if v is not None}
    status = diarize_files(model, args.audio, args.out, **{**model.postprocess, **post})
    for path, st in status.items():
        print(f"{path}: wrote {args.out}/{pathlib.Path(path).stem}.rttm" if st == "ok" else f"{path}: error: {st}")
    return 0 if all(st == "ok" for st in status.values()) else 1


def _cmd_diarize_simulate(args: argparse.Namespace) -> int:
    from .diarization.simulate import SimConfig, simulate

    cfg = SimConfig(n_mixtures=args.n, n_speakers=args.speakers, beta=args.beta, split=args.split, seed=args.seed,
                    min_utterances=args.min_utterances, max_utterances=args.max_utterances,
                    rt60=tuple(args.rt60) if args.rt60 else None)
    out = simulate(args.out, cfg, progress=lambda i, n, uri: _progress(i - 1, n, uri), jobs=args.jobs)
    print(file=sys.stderr)
    print(f"wrote {cfg.n_mixtures} mixtures to {out}/wav, {out}/ref.rttm, {out}/all.uem")
    return 0


def _cmd_diarize_train(args: argparse.Namespace) -> int:
    import torch

    from .diarization.dataset import MixtureSet
    from .diarization.model import EENDModel, ModelConfig
    from .diarization.train import TrainConfig, train

    torch.set_num_threads(args.threads)
    data = MixtureSet(args.data, n_speakers=args.speakers)
    torch.manual_seed(args.seed)
    model = EENDModel(ModelConfig(d_model=args.d_model, n_layers=args.layers, d_ff=4 * args.d_model,
                                  n_speakers=args.speakers, norm=args.norm, placement=args.placement,
                                  encoder=args.encoder))
    cfg = TrainConfig(steps=args.steps, lr=args.lr, warmup=args.warmup, ckpt_every=args.ckpt_every, seed=args.seed,
                      decay=args.decay)
    out = pathlib.Path(args.out)

    def progress(step, total, loss):
        _progress(step - 1, total, f"loss {loss:.4f}")

    losses = train(model, data.batches(args.batch, args.frames), cfg, out / "ckpt", progress)
    print(file=sys.stderr)
    model.save(out / "model.pt")
    print(f"trained {len(losses)} steps on {len(data.items)} mixtures; final loss "
          f"{sum(losses[-20:]) / len(losses[-20:]):.4f}; wrote {out / 'model.pt'}")
    return 0


def _cmd_diarize_recipe(args: argparse.Namespace) -> int:
    import torch

    from .diarization.recipe import RecipeConfig, run_recipe

    torch.set_num_threads(args.threads)
    cfg = RecipeConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RecipeConfig)})
    result = run_recipe(args.out, cfg, data=args.data, progress=_progress, jobs=args.threads)
    print(file=sys.stderr)
    pp = result["postprocess"]
    print(f"trained {cfg.steps} steps on {cfg.n_train + cfg.n_train_reverb} mixtures "
          f"({cfg.n_train_reverb} reverberant; {result['parameters']:,} parameters), "
          f"final loss {result['final_loss']:.4f}")
    print(f"dev ({cfg.n_dev} mixtures): threshold {pp['threshold']:g}, median {pp['median']} -> "
          f"DER {100 * result['dev_der']:.2f}%")
    sets = [(k, what) for k, what in (("test", "unseen espeak-ng voices"), ("test_reverb", "unseen voices, reverberant"),
                                      ("flite", "flite voices")) if k in result]
    for key, what in sets:
        for name, r in result[key].items():
            print(f"{key} ({result[key + '_recordings']} mixtures, {what}), {name.replace('_', ' ')} s: "
                  f"DER {100 * r['der']:.2f}% (false alarm {100 * r['false_alarm']:.2f}%, missed "
                  f"{100 * r['missed']:.2f}%, confusion {100 * r['confusion']:.2f}%)")
    print(f"wrote {args.out}/model.pt and {args.out}/results.json ({sum(result['seconds'].values()):.0f} s)")
    return 0


DIARIZE_COMMANDS = ("score", "run", "simulate", "train", "recipe")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normlab", description="Layer normalization for Transformers.")
    sub = p.add_subparsers(dest="command", required=True)

    les = sub.add_parser("lesson", help="reproduce the lessons' LayerNorm exercise and check it")
    les.add_argument("--batch", type=int, default=2, help="B, recordings (default 2)")
    les.add_argument("--tokens", type=int, default=4, help="T, frames per recording (default 4)")
    les.add_argument("--d-model", type=int, default=6, help="D, features per frame (default 6)")
    les.add_argument("--seed", type=int, default=42, help="torch.manual_seed (default 42)")
    les.add_argument("--json", action="store_true", help="print the figures as JSON")
    les.set_defaults(func=_cmd_lesson)

    cnt = sub.add_parser("count", help="norm parameters and FLOPs of a model preset")
    cnt.add_argument("--preset", default="bert-base", help="bert-base or bert-large")
    cnt.add_argument("--json", action="store_true")
    cnt.set_defaults(func=_cmd_count)

    from .studies import STUDIES

    rep = sub.add_parser("report", help="run every study and write an HTML report with verdicts")
    rep.add_argument("--out", default="report", help="output folder (default: report)")
    rep.add_argument("--quick", action="store_true", help="small sweep, <= 10 minutes on 2 cores")
    rep.add_argument("--jobs", type=int, default=2, help="worker processes for the cells (default 2)")
    rep.add_argument("--only", nargs="+", choices=STUDIES, help="run only these studies")
    rep.set_defaults(func=_cmd_report)

    stu = sub.add_parser("study", help="run one study (same store and output as report)")
    stu.add_argument("name", choices=STUDIES)
    stu.add_argument("--out", default="report")
    stu.add_argument("--quick", action="store_true")
    stu.add_argument("--jobs", type=int, default=2)
    stu.set_defaults(func=_cmd_study)

    dia = sub.add_parser("diarize", help="speaker diarization: AUDIO... to RTTM, and DER scoring")
    dsub = dia.add_subparsers(dest="diarize_command", required=True)
    sc = dsub.add_parser("score", help="diarization error rate of HYP against REF (RTTM files)")
    sc.add_argument("ref", help="reference RTTM file, or a folder of them")
    sc.add_argument("hyp", nargs="+", help="hypothesis RTTM files, or folders of them (e.g. the --out of diarize)")
    sc.add_argument("--collar", type=float, default=0.25,
                    help="seconds forgiven on each side of every reference boundary (default 0.25, as EEND)")
    sc.add_argument("--skip-overlap", action="store_true", help="do not score overlapped reference speech")
    sc.add_argument("--uem", help="UEM file: score only these regions")
    sc.set_defaults(func=_cmd_diarize_score)
    si = dsub.add_parser("simulate", help="simulate conversations with espeak-ng voices (EEND recipe)")
    si.add_argument("--out", required=True, help="output folder (re-running resumes)")
    si.add_argument("--n", type=int, default=100, help="mixtures (default 100)")
    si.add_argument("--speakers", type=int, default=2)
    si.add_argument("--beta", type=float, default=2.0, help="mean silence before an utterance, s (default 2)")
    si.add_argument("--split", choices=["train", "dev", "test", "flite"], default="train", help="disjoint voice variants")
    si.add_argument("--min-utterances", type=int, default=5)
    si.add_argument("--max-utterances", type=int, default=20)
    si.add_argument("--seed", type=int, default=0)
    si.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    si.add_argument("--rt60", type=float, nargs=2, metavar=("MIN", "MAX"),
                    help="add reverberation, RT60 drawn from [MIN, MAX] seconds (default: dry)")
    si.set_defaults(func=_cmd_diarize_simulate)
    tr = dsub.add_parser("train", help="train an EEND model on simulated mixtures (resumes from OUT/ckpt)")
    tr.add_argument("--data", required=True, help="a folder written by `normlab diarize simulate`")
    tr.add_argument("--out", required=True, help="writes OUT/model.pt and checkpoints in OUT/ckpt")
    tr.add_argument("--steps", type=int, default=2000)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--warmup", type=int, default=200)
    tr.add_argument("--decay", choices=["none", "cosine"], default="none", help="after warmup (default: constant)")
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--frames", type=int, default=500, help="100 ms frames per training window (default 500)")
    tr.add_argument("--d-model", type=int, default=128)
    tr.add_argument("--layers", type=int, default=2)
    tr.add_argument("--speakers", type=int, default=2)
    tr.add_argument("--norm", default="layernorm")
    tr.add_argument("--placement", default="pre")
    tr.add_argument("--encoder", choices=["transformer", "conformer"], default="transformer")
    tr.add_argument("--ckpt-every", type=int, default=100)
    tr.add_argument("--threads", type=int, default=2)
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(func=_cmd_diarize_train)
    rn = dsub.add_parser("run", help="write OUT/<stem>.rttm for each audio file (also: normlab diarize AUDIO...)")
    rn.add_argument("audio", nargs="+", help="WAV/FLAC files, any sample rate")
    rn.add_argument("--model", default=None,
                    help="a model saved by EENDModel.save (default: the model shipped with normlab)")
    rn.add_argument("--out", default="rttm", help="output folder (default: rttm)")
    rn.add_argument("--threshold", type=float, default=None, help="speaker activity threshold (default: the model's)")
    rn.add_argument("--median", type=int, default=None, help="median filter width in frames, odd (default: the model's)")
    rn.set_defaults(func=_cmd_diarize_run)
    from .diarization.recipe import RecipeConfig  # its fields are the recipe's options

    rc = dsub.add_parser("recipe", help="simulate, train, tune on dev, score on test: the shipped model's recipe")
    rc.add_argument("--out", required=True, help="writes OUT/model.pt, OUT/results.json (re-running resumes)")
    rc.add_argument("--data", default=None, help="folder for the simulated splits (default OUT/data)")
    rc.add_argument("--threads", type=int, default=2)
    for f in dataclasses.fields(RecipeConfig):  # every knob of the recipe, with its default
        rc.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                        help="default: %(default)s")
    rc.set_defaults(func=_cmd_diarize_recipe)

    from .bench import DTYPES, OPS, SHAPES

    ben = sub.add_parser("bench", help="time normlab's norms against torch's (ratios, GB/s, memory)")
    ben.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    ben.add_argument("--shapes", nargs="+", type=_shape, default=list(SHAPES), help="NxD, e.g. 8192x768")
    ben.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"], default=list(DTYPES))
    ben.add_argument("--repeats", type=int, default=15, help="timed repeats per case (median reported)")
    ben.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ben.add_argument("--cold-start", action="store_true", help="also time a fresh process with an empty compile cache")
    ben.add_argument("--out", default="bench-out", help="folder for bench.json and bench.md")
    ben.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    words = [a for a in argv[1:] if not a.startswith("-")]
    if argv[:1] == ["diarize"] and words and words[0] not in DIARIZE_COMMANDS:
        argv.insert(1, "run")  # `normlab diarize [--model M] AUDIO...` is `normlab diarize run ...`
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"normlab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
