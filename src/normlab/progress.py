"""Progress bars (tqdm): width-aware, with ETA, off when stderr is not a terminal (no ``\\r`` in logs)."""
from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """One bar per task name; ``show(task, done, total, note)`` moves it, and closes it when done.

    Args:
        enabled: False draws nothing. None (default): draw only when stderr is a terminal.
    """

    def __init__(self, enabled: bool | None = None, stream=None):
        stream = stream if stream is not None else sys.stderr
        self.enabled = bool(stream.isatty()) if enabled is None else enabled
        self.stream = stream
        self._bars: dict[str, tqdm] = {}

    def show(self, task: str, done: int, total: int, note: str = "") -> None:
        if not self.enabled:
            return
        bar = self._bars.get(task)
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = self._bars[task] = tqdm(total=total, desc=task, file=self.stream, dynamic_ncols=True, leave=True,
                                          initial=0)
        bar.update(done - bar.n)
        if note:
            bar.set_postfix_str(note[:40], refresh=True)
        if done >= total:
            bar.close()
            del self._bars[task]

    def callback(self, task: str):
        """An ``f(i, n, label)`` callback (``i`` counted from 0) for library functions that report progress."""
        return lambda i, n, label="": self.show(task, i + 1, n, str(label))

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
