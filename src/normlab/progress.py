"""Progress: a tqdm bar on a terminal (width-aware, with ETA); in a log, a plain line now and then.

Where stderr is not a terminal (``nohup ... > log``, a pipe, CI) a bar's ``\\r`` redraws would flood the log,
and a silent hour looks like a hang: a task that runs longer than :data:`LOG_EVERY` seconds writes one line
each ``LOG_EVERY`` seconds and one when it ends (``train: 1200/6400 (loss 0.412) after 0:10:03``); a shorter
one writes nothing.
"""
from __future__ import annotations

import datetime
import sys
import time

from tqdm import tqdm

#: seconds between a task's lines in a log (not a terminal)
LOG_EVERY = 30.0


class Progress:
    """One bar (or log line) per task name; ``show(task, done, total, note)`` moves it, and closes it when done.

    Args:
        enabled: False shows nothing. None (default): a bar when stderr is a terminal, else log lines.
        stream: where to write (default stderr).
    """

    def __init__(self, enabled: bool | None = None, stream=None):
        stream = stream if stream is not None else sys.stderr
        self.stream = stream
        self.enabled = enabled is not False
        self.bars = bool(stream.isatty()) if enabled is None else bool(enabled)
        self._bars: dict[str, tqdm] = {}
        self._lines: dict[str, list[float]] = {}  # task -> [started, last line written (0: none yet)]

    def show(self, task: str, done: int, total: int, note: str = "") -> None:
        if not self.enabled:
            return
        if not self.bars:
            self._line(task, done, total, note)
            return
        bar = self._bars.get(task)
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = self._bars[task] = tqdm(total=total, desc=task, file=self.stream, dynamic_ncols=True, leave=True,
                                          initial=0)
        if note:  # drawn with the count, at tqdm's pace: refreshed on every step it redrew a terminal 228 times a
            bar.set_postfix_str(note[:40], refresh=False)  # second
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            del self._bars[task]

    def _line(self, task: str, done: int, total: int, note: str) -> None:
        now = time.monotonic()
        started, last = self._lines.setdefault(task, [now, 0.0])
        finished = done >= total
        if now - (last or started) >= LOG_EVERY or (finished and last):
            elapsed = datetime.timedelta(seconds=round(now - started))
            print(f"{task}: {done}/{total}{f' ({note[:60]})' if note else ''} after {elapsed}", file=self.stream,
                  flush=True)
            self._lines[task][1] = now
        if finished:
            del self._lines[task]

    def callback(self, task: str):
        """An ``f(i, n, label)`` callback (``i`` counted from 0) for library functions that report progress."""
        return lambda i, n, label="": self.show(task, i + 1, n, str(label))

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
        self._lines.clear()
