"""Command line: ``normlab SUBCOMMAND``. Thin: parse, call the library, print."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_lesson(args: argparse.Namespace) -> int:
    from .lesson import LessonConfig, format_lesson, run_lesson

    cfg = LessonConfig(batch=args.batch, tokens=args.tokens, d_model=args.d_model, seed=args.seed)
    result = run_lesson(cfg)
    print(json.dumps(result, indent=2) if args.json else format_lesson(result))
    return 0 if result["passed"] else 1


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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"normlab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
