"""Progress in a log: a line now and then for a long task, nothing for a short one, no carriage returns."""
from __future__ import annotations

import io

from normlab import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_long_task_in_a_log_writes_a_line_every_interval_and_one_at_the_end(monkeypatch):
    """Piped to a file, a training run wrote nothing until it ended (an hour looked like a hang)."""
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    log = io.StringIO()
    p = progress.Progress(stream=log)
    for step in range(1, 101):
        clock.now += 1.0  # one second a step: a line every 30 steps, then the last
        p.show("train", step, 100, f"loss {1 / step:.3f}")
    lines = log.getvalue().splitlines()
    # the task starts at its first report (step 1): 30 s later is step 31
    assert lines == ["train: 31/100 (loss 0.032) after 0:00:30", "train: 61/100 (loss 0.016) after 0:01:00",
                     "train: 91/100 (loss 0.011) after 0:01:30", "train: 100/100 (loss 0.010) after 0:01:39"]
    assert "\r" not in log.getvalue()


def test_a_short_task_in_a_log_writes_nothing_and_off_is_off(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    log = io.StringIO()
    for enabled in (None, False):
        p = progress.Progress(enabled=enabled, stream=log)
        for i in range(10):
            clock.now += 1.0 if enabled is None else 100.0
            p.callback("simulate")(i, 10, f"m{i}")
    assert log.getvalue() == ""


def test_a_terminal_gets_a_bar():
    out = Terminal()
    p = progress.Progress(stream=out)
    for i in range(5):
        p.show("bench", i + 1, 5)
    assert "bench" in out.getvalue() and "5/5" in out.getvalue()


def test_a_terminal_bar_with_a_note_is_redrawn_at_tqdms_pace_not_every_step():
    """A note set with refresh=True redrew the bar at every step: 2,280 redraws (242 KB) in 10 s of training."""
    out = Terminal()
    p = progress.Progress(stream=out)
    for i in range(2000):
        p.show("train", i + 1, 2000, f"loss {1 / (i + 1):.3f}")
    assert out.getvalue().count("\r") < 50 and "2000/2000" in out.getvalue() and "loss 0.001" in out.getvalue()
