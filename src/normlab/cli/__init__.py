"""Command line: ``normlab COMMAND``. Thin: parse, call the library, print.

Each command group lives in its own module (``lab``, ``report``, ``diarize``)
with its parsers next to its handlers. Only the group being run builds its
full parser, so ``normlab --help`` never imports torch.

Errors: a usage error (argparse) or a :class:`normlab.UserError` from the
library is the user's to fix: one line on stderr, exit status 2 (with
``NORMLAB_DEBUG=1`` the error is raised on instead: its traceback, exit
status 1). Any other exception is a bug: its
traceback, a line saying so, exit status 1. Commands over many files
(``diarize run``, ``evaluate``) write every file they can and exit 1 where
some could not be read (each named on stderr with its one-line reason).
A closed output pipe exits 141, an interruption 130.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import signal
import sys
import threading
import traceback
from importlib import metadata

from . import diarize, lab, report

#: command -> the module that parses and runs it
GROUPS = {name: mod for mod in (lab, report, diarize) for name in mod.HELP}

class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``normlab lesson: error: argument --d-model: ...`` (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: str) -> str:
    """``message`` on one line, its line breaks written ``\\n`` (a path may hold one: the line before it was all
    that was said, "error: no" for the file "no\\nsuch.rttm")."""
    return message.strip("\n").replace("\r", "\\r").replace("\n", "\\n")


def _version() -> str:
    from .. import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"normlab {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s group gets its full options (the others: name and help)."""
    p = _Parser(prog="normlab", description="Layer normalization for Transformers: norms, kernels, "
                                "placements, studies and speaker diarization.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, mod in GROUPS.items():
        if name == command:
            mod.add_parsers(sub, name)
        else:
            sub.add_parser(name, help=mod.HELP[name], add_help=False)
    return p


def _mistyped_command(word: str) -> bool:
    """``tunee`` or ``evalute``: no such file, and close to a sub-command's name (argparse then names them all)."""
    return not os.path.exists(word) and bool(difflib.get_close_matches(word, diarize.COMMANDS, n=1, cutoff=0.75))


def _normalize(argv: list[str]) -> list[str]:
    """``normlab diarize [OPTIONS] AUDIO...`` is ``normlab diarize run [OPTIONS] AUDIO...``.

    ``diarize`` has no options of its own, so its sub-command, if any, is the word right after it: an option
    there (``normlab diarize --out train talk.wav``) starts the shorthand, whatever word is its value."""
    if argv[:1] != ["diarize"] or len(argv) < 2 or argv[1] in ("-h", "--help"):
        return argv
    first = argv[1]
    if first.startswith("-") or (first not in diarize.COMMANDS and not _mistyped_command(first)):
        return ["diarize", "run", *argv[1:]]
    return argv


#: what a full or read-only disk answers a write: the machine's state, not a bug, with or without a path
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
#: a path the system will not look up: a name longer than the file system takes, links that loop
NAME_REFUSED = (errno.ENAMETOOLONG, errno.ELOOP)


def _a_path_the_system_refused(e: Exception) -> bool:
    """An OSError naming a path (permission denied, not a directory, no such folder, read-only file system, a
    name too long, a link loop): the path the user gave, not a bug. Other OSErrors (and errors naming no path)
    keep their traceback."""
    if not getattr(e, "filename", None):
        return False
    return isinstance(e, (PermissionError, FileExistsError, FileNotFoundError, NotADirectoryError,
                          IsADirectoryError)) or (isinstance(e, OSError) and e.errno in FULL_DISK + NAME_REFUSED)


def _first_line(text: str, most: int = 160) -> str:
    """The first line of ``text``, cut at a word's end within ``most`` characters (a cut mid-word read "Cannot
    alloca")."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= most else line[:most].rsplit(" ", 1)[0] + " ..."


def _out_of_memory(e: Exception) -> bool:
    """Python's MemoryError, or torch's allocators refusing a size (CPU or GPU)."""
    text = str(e)
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        "not enough memory" in text or "can't allocate memory" in text or "out of memory" in text.lower()
        or "Storage size calculation overflowed" in text))


def main(argv: list[str] | None = None) -> int:
    argv = _normalize(list(sys.argv[1:] if argv is None else argv))
    command = argv[0] if argv and argv[0] in GROUPS else None
    try:
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
        if extra:  # named after the (sub)command that was parsed, whose --help lists what it takes
            prog = _prog(args)
            parser.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
    except SystemExit as e:  # --help, --version (0) or a usage error (2), already printed
        return int(e.code or 0)
    import warnings

    # a warning is one line for the person at the terminal, as errors are (not Python's file:line and source);
    # Python's own format again once the command returns (main may run inside a program)
    python_format = warnings.formatwarning
    # (the library's own "normlab: " prefix once: "normlab bench: warning: normlab: NORMLAB_STREAM_BYTES=...")
    warnings.formatwarning = lambda message, category, *_, **__: \
        f"{_prog(args)}: warning: {str(message).removeprefix('normlab: ')}\n"
    try:
        with _terminate_as_interrupt():
            return _run(args)
    finally:
        warnings.formatwarning = python_format


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a job scheduler), raised where the command runs."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM stops the command as Ctrl-C does: its workers stopped, finished work kept, one line. It was Python's
    default, an exit with nothing said, and a line of ``resource_tracker`` warnings about leaked semaphores from
    the commands with worker processes. Installed only over the default handler, in the main thread, for the
    command's run (main may run inside a program, which keeps its own)."""
    def stop(signum, frame):
        raise Terminated

    stop.normlab_stops = True  # a rank blocked in torch.distributed hears it too (distributed._heard_while_blocked)

    try:
        before = signal.getsignal(signal.SIGTERM)
        mine = before == signal.SIG_DFL and threading.current_thread() is threading.main_thread()
        if mine:
            signal.signal(signal.SIGTERM, stop)
    except (ValueError, AttributeError):  # no SIGTERM here, or not the main interpreter
        mine = False
    try:
        yield
    finally:
        if mine:
            signal.signal(signal.SIGTERM, before)


def _prog(args) -> str:
    """The command as its usage errors name it (``normlab diarize train``), for its run-time lines too."""
    sub = getattr(args, "diarize_command", None)
    return f"normlab {args.command}" + (f" {sub}" if sub else "")


def _run(args) -> int:
    """The command, with what goes wrong turned into an exit status (and one line, or a bug's traceback)."""
    try:
        return args.func(args)
    except KeyboardInterrupt as e:
        # only the commands that keep finished work (their parsers set ``resumes``) promise a resume
        again = " (finished work is kept; re-run to resume)" if getattr(args, "resumes", False) else ""
        stopped = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"{_prog(args)}: {stopped}{again}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130  # 128 + the signal, as a shell reports it
    except BrokenPipeError:  # the reader of our output went away (`normlab ... | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe ended
    except OSError as e:
        if getattr(e, "filename", None) or e.errno not in FULL_DISK:
            return _failed(args, e)
        # stdout, or a file written through its handle, on a full disk (the error names no file); what the
        # failed write held is dropped, so the exit's flush does not fail again, and stdout stays the caller's
        print(f"{_prog(args)}: error: cannot write its output: {e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:
        return _failed(args, e)


def _failed(args, e: Exception) -> int:
    """A command's exception as an exit status: one line for what the user can mend, a traceback for a bug."""
    from .._checks import UserError, env_on, path_refused  # imports torch: only once something has gone wrong

    if _a_path_the_system_refused(e):  # a folder that cannot be made, a file where a folder goes, no permission
        e = UserError(path_refused(e))
    elif _out_of_memory(e) and not isinstance(e, UserError):  # sizes the machine cannot hold: the request, not a bug
        # (normlab's own one-line errors, a failed study cell or a lost worker among them, are said as they are)
        e = UserError(f"out of memory ({_first_line(str(e)) or 'MemoryError'}): ask for smaller sizes")
    if not isinstance(e, UserError):
        traceback.print_exc()
        print(f"{_prog(args)}: internal error ({type(e).__name__}): a bug in normlab, not a mistake in "
              "the command; please report it with the traceback above", file=sys.stderr)
        return 1
    if os.environ.get("NORMLAB_DEBUG", "").strip() and env_on("NORMLAB_DEBUG"):  # set, and not 0/false/no/off
        raise  # to the caller (a debugger, a test): Python prints the traceback, exit status 1
    message = one_line(str(e)) if str(e) else type(e).__name__
    print(f"{_prog(args)}: error: {message}", file=sys.stderr)
    return 2


__all__ = ["main", "build_parser", "GROUPS"]
