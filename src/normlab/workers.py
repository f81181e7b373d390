"""Worker processes of the pools that simulate, segment and run study cells.

Ctrl-C reaches every process of the terminal's process group: the parent reports the interruption in one line
and keeps what was finished (``cli.main``), and each worker, started with :func:`exit_on_interrupt`, ends at once
without a word (it would otherwise print a traceback of its own: one per worker). A parent that ends otherwise
(``kill``, a ``timeout`` command, out of memory) takes its workers with it: on Linux each asks the kernel for
SIGTERM when its parent dies; they went on running their cells for nobody, each holding a copy of torch.
"""
from __future__ import annotations

import ctypes
import os
import platform
import signal

_PR_SET_PDEATHSIG = 1


def exit_on_interrupt() -> None:
    """A pool worker's initializer: SIGINT ends this process at once, quietly (exit status 130); so does its
    parent's death (SIGTERM, exit status 143)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    if platform.system() == "Linux":
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl (not glibc): the workers outlive a killed parent, as before
            pass
