"""``normlab lesson``, ``normlab count``, ``normlab bench``: the laboratory's tools."""
from __future__ import annotations

import argparse
import json
import sys

from ..devices import check_spec
from ._common import OVERWRITE, OVERWRITE_HELP, a_folder, flag, number, progress, seed, shape, threads

HELP = {
    "lesson": "reproduce the lessons' LayerNorm exercise and check it",
    "count": "norm parameters and FLOPs of a model preset",
    "bench": "time normlab's norms against torch's (ratios, GB/s, memory)",
}


#: the lesson's sizes: whole numbers a tensor dimension can hold (a larger one overflowed inside torch)
_size = number(int, lambda v: 1 <= v < 2**31, "a whole number from 1 to 2**31 - 1")


#: ``bench --repeats``: a median of up to ten thousand timings per case (more only runs for nobody)
_repeats = number(int, lambda v: 1 <= v <= 10_000, "a whole number from 1 to 10000")
REPEATS = 15  # timed repeats per case, the median reported


def _features(text: str) -> int:
    """The lesson's ``--d-model``: at least 4, as over fewer features a token's variance can vanish into eps."""
    v = _size(text)
    if v < 4:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 4 (over fewer features a token's variance "
                                         f"can vanish into eps), got {text!r}")
    return v


def _frames(text: str) -> int:
    """The lesson's ``--tokens``: at least 2, as InstanceNorm, which the lesson compares, normalizes each feature
    over a recording's frames."""
    v = _size(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 2 (InstanceNorm normalizes over the frames), "
                                         f"got {text!r}")
    return v


def _json(result: dict) -> str:
    """``--json``: the figures with the versions and machine that made them, as every artifact records."""
    from .. import provenance

    return json.dumps({**result, "provenance": provenance.record()}, indent=2)


def _lesson(args: argparse.Namespace) -> int:
    from ..lab.lesson import LessonConfig, format_lesson, run_lesson

    cfg = LessonConfig(batch=args.batch, tokens=args.tokens, d_model=args.d_model, seed=args.seed)
    result = run_lesson(cfg)
    print(_json(result) if args.json else format_lesson(result))
    return 0 if result["passed"] else 1


def _count(args: argparse.Namespace) -> int:
    from ..lab.accounting import count_preset, format_count

    result = count_preset(args.preset)
    print(_json(result) if args.json else format_count(result))
    return 0


def _bench(args: argparse.Namespace) -> int:
    import torch

    from .._checks import BadValue
    from ..devices import resolve
    from ..lab import bench_files
    from ..lab.bench import DTYPES, OPS, SHAPES

    torch.set_num_threads(args.threads)
    for name, on in (("--profile", args.profile), ("--compile", args.compile)):
        if on and not args.model:
            raise BadValue(f"{name} needs --model (it times the whole encoder)")
    typed = lambda *names: any(getattr(args, n) is not None for n in names)  # noqa: E731
    if args.model and (args.dispatch or args.cold_start or typed("ops", "shapes", "dtypes")):
        raise BadValue("--model times the whole encoder: --dispatch, --ops, --shapes, --dtypes and --cold-start "
                       "are for the norms' table")
    # the encoder and the dispatch table are measured on the CPU only; the dispatch table times its own samples
    for on, name in ((args.model, "--model"), (args.dispatch, "--dispatch")):
        if on and args.device != "cpu":
            raise BadValue(f"{name} measures on the CPU: --device {args.device} is for the norms' table")
    if args.device not in ("cpu", "auto") and (args.cold_start or typed("repeats", "ops", "shapes", "dtypes")):
        raise BadValue(f"--device {args.device} times the GPU section's fixed grid (docs/scaling.md): --ops, "
                       "--shapes, --dtypes, --repeats and --cold-start are for the CPU table (--device cpu or auto)")
    if args.dispatch and (args.cold_start or typed("repeats")):
        raise BadValue("--dispatch reports auto's decisions, each timed on its own sample: --cold-start and "
                       "--repeats are for the norms' table")
    # each value once, in the order given (a value given twice was timed twice)
    for name, default in (("ops", list(OPS)), ("shapes", list(SHAPES)), ("dtypes", list(DTYPES))):
        setattr(args, name, default if getattr(args, name) is None else list(dict.fromkeys(getattr(args, name))))
    args.repeats = REPEATS if args.repeats is None else args.repeats
    device = resolve(args.device)  # before the folder is made: a missing GPU leaves nothing behind
    kind = "model" if args.model else "dispatch" if args.dispatch else "norms"
    _check_out(args, kind)
    result, table = bench_files.measure(
        kind, ops=args.ops, shapes=args.shapes, dtypes=args.dtypes, repeats=args.repeats, cold_start=args.cold_start,
        cpu_table=args.device in ("cpu", "auto"), device=device, compiled=args.compile, profile=args.profile,
        progress=progress({"model": "bench --model", "dispatch": "bench --dispatch", "norms": "bench"}[kind]))
    print(table)
    files = bench_files.write(args.out, kind, result, table)
    print(f"wrote {', '.join(map(str, files))}", file=sys.stderr)
    return 0


def _check_out(args: argparse.Namespace, kind: str) -> None:
    """Before any measuring: the folder can be made and written to, and no file there that normlab did not write
    is replaced."""
    from .. import written
    from ..lab.bench_files import outputs

    written.check(outputs(args.out, kind), overwrite=args.overwrite, hint="give another --out")
    written.writable_folder(args.out)


def add_parsers(sub, name: str) -> None:
    if name == "lesson":
        p = sub.add_parser("lesson", help=HELP["lesson"], description=HELP["lesson"])
        p.add_argument("--batch", type=_size, default=2, help="B, recordings (default: %(default)s)")
        p.add_argument("--tokens", type=_frames, default=4,
                       help="T, frames per recording, at least 2 (default: %(default)s)")
        p.add_argument("--d-model", type=_features, default=6,
                       help="D, features per frame, at least 4 (default: %(default)s)")
        p.add_argument("--seed", type=seed, default=42, help="random seed of the input (default: %(default)s)")
        flag(p, "--json", "print the figures as JSON")
        p.set_defaults(func=_lesson)
    elif name == "count":
        from ..lab.accounting import PRESETS

        p = sub.add_parser("count", help=HELP["count"], description=HELP["count"])
        p.add_argument("--preset", choices=list(PRESETS), default="bert-base",
                       help="model preset (default: %(default)s)")
        flag(p, "--json", "print the figures as JSON")
        p.set_defaults(func=_count)
    elif name == "bench":
        from ..lab.bench import DTYPES, OPS

        p = sub.add_parser("bench", help=HELP["bench"], description=HELP["bench"])
        # each may be given more than once, adding to what it lists (as report --only): argparse kept the last
        p.add_argument("--ops", nargs="+", action="extend", choices=OPS, help="ops to time (default: all)")
        p.add_argument("--shapes", nargs="+", action="extend", type=shape,
                       help="NxD rows x features, e.g. 8192x768 (default: the standard set)")
        p.add_argument("--dtypes", nargs="+", action="extend", choices=["float32", "bfloat16", "float16"],
                       help=f"dtypes (default: {' '.join(DTYPES)})")
        # no argparse defaults for these four: an option is refused where it does not apply whenever it was typed,
        # even at its default's value (_bench fills them in after its checks)
        p.add_argument("--repeats", type=_repeats, help=f"timed repeats per case, median reported (default: {REPEATS})")
        p.add_argument("--threads", type=threads, default=2, help="torch threads (default: %(default)s)")
        flag(p, "--cold-start", "also time a fresh process with an empty compile cache")
        p.add_argument("--device", type=check_spec, default="cpu",
                       help="cpu: the CPU table; cuda[:N]: the GPU section; auto: the CPU table, then the GPU section "
                       "when CUDA is present (default: %(default)s)")
        flag(p, "--model", "instead: a 6-layer Pre-LN encoder's training step and inference against "
                       "torch.nn.TransformerEncoder(norm_first=True) and against itself on torch's norm kernels, "
                       "after checking that the outputs agree within 1e-5; three rounds, their spread reported "
                       "(writes bench-model.json/.md/.png)")
        flag(p, "--compile", "with --model: also time compile_blocks(model)")
        flag(p, "--profile", "with --model: also print the training step's split (GEMMs, attention, norms and adds, "
             "activation, optimizer, other) from torch.profiler")
        flag(p, "--dispatch", "instead: which kernel auto runs for each case here, and why (measuring first where "
             "a case is new; writes bench-dispatch.json/.md/.png)")
        p.add_argument("--out", type=a_folder, default="bench-out",
                       help="folder for bench.json, bench.md and bench.png (default: %(default)s)")
        flag(p, OVERWRITE, OVERWRITE_HELP)
        p.set_defaults(func=_bench)
