"""What every command shares: progress bars and argument types (no torch here)."""
from __future__ import annotations

import argparse

from ..progress import Progress


def progress(task: str):
    """An ``f(i, n, label)`` progress callback drawing a bar on a terminal (nothing in a log)."""
    return Progress().callback(task)


def shape(text: str) -> tuple[int, int]:
    """``8192x768`` -> ``(8192, 768)``: rows x features, each at least 1."""
    try:
        n, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 8192x768, got {text!r}") from None
    if n < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"shape needs at least 1 row and 1 feature, got {text!r}")
    return n, d


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {v}")
    return v
