"""Worker processes of the pools that simulate, segment and run study cells.

Ctrl-C reaches every process of the terminal's process group: the parent reports the interruption in one line
and keeps what was finished (``cli.main``), and each worker, started with :func:`exit_on_interrupt`, ends at once
without a word (it would otherwise print a traceback of its own: one per worker). A parent that ends otherwise
(``kill``, a ``timeout`` command, out of memory) takes its workers with it: on Linux each asks the kernel for
SIGTERM when its parent dies; they went on running their cells for nobody, each holding a copy of torch.
An interrupt sent to the parent alone (``kill -INT PID``, a scheduler) stops its workers too (:func:`pool`): the
parent waited for every cell in flight or queued, and then dropped what they computed.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import platform
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

_PR_SET_PDEATHSIG = 1


def exit_on_interrupt() -> None:
    """A pool worker's initializer: SIGINT ends this process at once, quietly (exit status 130); so does its
    parent's death (SIGTERM, exit status 143)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    die_with_parent()


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when this process's parent dies (Linux; elsewhere nothing): a pool worker, or
    a rank whose launcher was killed, does not go on working for nobody."""
    if platform.system() != "Linux":
        return
    parent = _parent()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl (not glibc): the process outlives a killed parent, as before
        return
    if os.getppid() != parent:  # the parent died before the request: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _parent() -> int:
    """The pid of the process that started this one: multiprocessing's record for its children, else the one
    read at normlab's import (a launcher's rank), not ``getppid()`` now, which names the reaper of an orphan."""
    spawned = mp.parent_process()
    if spawned is not None and spawned.pid:
        return spawned.pid
    from . import _ORIGIN

    pid, parent = _ORIGIN
    return parent if pid == os.getpid() else os.getppid()


@contextlib.contextmanager
def pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` spawned workers started with :func:`exit_on_interrupt`. Leaving the block on an interrupt or an
    error drops the queued work and interrupts the workers (their work in flight is lost, as on Ctrl-C) instead
    of waiting for all of it; leaving it normally waits for what was submitted."""
    workers = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=exit_on_interrupt)
    try:
        yield workers
    except BaseException:
        for process in list((getattr(workers, "_processes", None) or {}).values()):  # (no public list of them)
            if process.is_alive():
                with contextlib.suppress(OSError):  # ended meanwhile
                    os.kill(process.pid, signal.SIGINT)
        workers.shutdown(wait=True, cancel_futures=True)
        raise
    workers.shutdown(wait=True)
