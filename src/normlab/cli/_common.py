"""What every command shares: progress bars, argument types, on/off flags and renamed options (no torch here).

The vocabulary every command follows (``tests/test_cli_vocabulary.py`` checks it): counts are ``--n-<things>``
(``--n-layers``, ``--n-speakers``, ``--n-mixtures``); ``--jobs`` is worker processes, ``--threads`` torch threads
per process; ``--device`` is cpu, cuda, cuda:N or auto, default cpu; ``--out`` is the output folder; on/off
options are ``--x/--no-x``; every option's help says its default.
"""
from __future__ import annotations

import argparse
import os

from ..progress import Progress


def progress(task: str):
    """An ``f(i, n, label)`` progress callback drawing a bar on a terminal (nothing in a log)."""
    return Progress().callback(task)


def a_path(text: str) -> str:
    """A path that is not empty (an empty one would silently mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    return text


def a_folder(text: str) -> str:
    """A folder to write into: a path that is not empty and not an existing file (each command said otherwise:
    "X/wav: Not a directory", "X: File exists")."""
    text = a_path(text)
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file; this takes a folder")
    return text


def shape(text: str) -> tuple[int, int]:
    """``8192x768`` -> ``(8192, 768)``: rows x features, each at least 1."""
    try:
        n, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 8192x768, got {text!r}") from None
    if n < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"shape needs at least 1 row and 1 feature, got {text!r}")
    if n * d >= 2**62:  # beyond what a tensor's size can count (torch's overflow, not a shortage of memory)
        raise argparse.ArgumentTypeError(f"shape {text!r} has more elements than a tensor can hold")
    return n, d


#: the option that lets a command replace files in its output folder that normlab did not write (normlab.written)
OVERWRITE = "--overwrite"
OVERWRITE_HELP = ("replace output files that exist and were not written by normlab, or were changed since "
                  "(without it such a file stops the command before any work)")


def flag(parser: argparse.ArgumentParser, name: str, help: str, default: bool = False, *,
         was_valued: bool = False) -> None:
    """An on/off option ``--name/--no-name`` (off by default). ``was_valued``: the option once took a value
    (``--name 0|1``), which now stops with one line naming the new spelling; only for commands without
    positional arguments, which such an option could take for its value."""
    parser.add_argument(name, action=_ValuedOnce if was_valued else argparse.BooleanOptionalAction, default=default,
                        help=f"{help} (default: {name if default else '--no-' + name[2:]})")


class _ValuedOnce(argparse.BooleanOptionalAction):
    """``--name/--no-name`` where ``--name 0|1`` was the old spelling: a value is a usage error naming the new."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, **kw)
        self.nargs = "?"

    def __call__(self, parser, namespace, values, option_string=None):
        if values is not None:
            on = option_string if not option_string.startswith("--no-") else "--" + option_string[5:]
            parser.error(f"{option_string} {values} is now {on} or --no-{on[2:]}")
        super().__call__(parser, namespace, None, option_string)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with an on/off option that once took a value shown as the switch it is now
    (``--augment, --no-augment``, not ``--augment [AUGMENT]``)."""

    def _format_args(self, action, default_metavar):
        return "" if isinstance(action, _ValuedOnce) else super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action):
        if isinstance(action, _ValuedOnce):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


class Renamed(argparse.Action):
    """An option's old spelling: a usage error naming the new one (hidden from --help)."""

    def __init__(self, option_strings, dest, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.new}")


def renamed(parser: argparse.ArgumentParser, **old_to_new: str) -> None:
    """Old spellings (``layers="--n-layers"`` for ``--layers``) that stop with a message naming the new one."""
    for old, new in old_to_new.items():
        parser.add_argument(f"--{old.replace('_', '-')}", action=Renamed, new=new, dest=f"_renamed_{old}")


def number(convert, ok, expected: str):
    """An argparse type: ``convert(text)`` where ``ok`` holds it, else the usage error "expected <expected>"."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return v
    return parse


#: ``--seed``: what torch's and numpy's generators take
seed = number(int, lambda v: 0 <= v < 2**63, "a whole number from 0 to 2**63 - 1")
#: ``--threads``: more than four per core only queues them (a thousand made a tiny training step take minutes)
_MOST_THREADS = 4 * (os.cpu_count() or 1)
threads = number(int, lambda v: 1 <= v <= _MOST_THREADS,
                 f"a whole number from 1 to {_MOST_THREADS} (four per core of this machine)")
#: ``--jobs``: worker processes, each with its own copy of torch (about 150 MB): as many as threads at most
jobs = number(int, lambda v: 1 <= v <= _MOST_THREADS,
              f"a whole number from 1 to {_MOST_THREADS} (four per core of this machine)")


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {v}")
    return v
