"""Worker processes of the pools that simulate, segment and run study cells.

Ctrl-C reaches every process of the terminal's process group: the parent reports the interruption in one line
and keeps what was finished (``cli.main``), and each worker, started with :func:`exit_on_interrupt`, ends at once
without a word (it would otherwise print a traceback of its own: one per worker).
"""
from __future__ import annotations

import os
import signal


def exit_on_interrupt() -> None:
    """A pool worker's initializer: SIGINT ends this process at once, quietly (exit status 130)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
