"""``normlab report`` and ``normlab study``: the claims, checked and written up."""
from __future__ import annotations

import argparse

from ..devices import HELP as DEVICE_HELP
from ..devices import check_spec
from ._common import OVERWRITE, OVERWRITE_HELP, a_folder, flag, jobs

HELP = {
    "report": "run every study and write an HTML report with verdicts",
    "study": "run one study (same store and output as report)",
}


def _report(args: argparse.Namespace) -> int:
    from ..devices import resolve
    from ..studies.report import run_studies, study_tables, verdict_table

    if args.address is not None and args.executor != "ray":  # ("" as well: it ran locally without a word)
        from .._checks import BadValue

        raise BadValue("--address joins a Ray cluster: it needs --executor ray (the local executor has no address)")
    scale = "quick" if args.quick else "full"
    device = resolve(args.device)
    result = run_studies(args.out, scale=scale, jobs=args.jobs, only=args.only, executor=args.executor,
                         address=args.address, device=str(device), overwrite=args.overwrite)
    print(verdict_table(result))
    tables = study_tables(result)
    if tables:
        print("\n" + tables)
    print(f"wrote {args.out}/index.html, {args.out}/results.json, {args.out}/runs.sqlite ({result['seconds']} s)")
    return 0


def _study(args: argparse.Namespace) -> int:
    args.only = [args.name]
    return _report(args)


def _common(p: argparse.ArgumentParser, quick: str) -> None:
    p.add_argument("--out", type=a_folder, default="report", help="output folder; re-running resumes from its store "
                   "(default: %(default)s)")
    flag(p, "--quick", quick)
    p.add_argument("--jobs", type=jobs, default=2, help="worker processes for the cells, or the CPUs of the local "
                   "Ray instance (with --address the cluster's own CPUs decide) (default: %(default)s)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where the cells run: local worker processes, or Ray tasks (needs normlab[scale]); the "
                   "store is the same, so either resumes the other (default: %(default)s)")
    p.add_argument("--address", default=None, metavar="auto|HOST:PORT|ray://HOST[:PORT]",
                   help="with --executor ray: join this cluster, or its client server (ray://) (default: start a "
                   "local Ray with --jobs CPUs)")
    p.add_argument("--device", type=check_spec, default="cpu", help=f"{DEVICE_HELP} (default: %(default)s)")
    flag(p, OVERWRITE, OVERWRITE_HELP)


def add_parsers(sub, name: str) -> None:
    from ..studies import STUDIES

    if name == "report":
        p = sub.add_parser("report", help=HELP["report"], description=HELP["report"])
        _common(p, "small sweep, about 8 to 21.5 minutes on 2 idle cores by host (--no-quick: the full sweep)")
        p.add_argument("--only", nargs="+", action="extend", choices=STUDIES,
                       help="run only these studies (default: all; --only may be given more than once)")
        p.set_defaults(func=_report, resumes=True)
    elif name == "study":
        p = sub.add_parser("study", help=HELP["study"], description=HELP["study"])
        p.add_argument("name", choices=STUDIES, help="the study to run")
        _common(p, "the report's small sweep for this study, from about a second (lesson_stats) to minutes (the "
                "trained studies) (--no-quick: the full sweep)")
        p.set_defaults(func=_study, resumes=True)
