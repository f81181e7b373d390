"""Run tracking: every training run writes ``metrics.csv`` (and TensorBoard scalars when asked).

Columns: ``step, loss, lr, grad_norm, seconds`` (``step`` counts optimizer
steps from 1; ``grad_norm`` is the total gradient 2-norm before clipping;
``seconds`` is the run's wall time so far). :class:`MetricsLog` writes one row
per step next to a run's checkpoint; a resumed run first drops the rows after
its checkpoint's step, so the file never holds a step twice.

Study cells have no checkpoint: :func:`collect` gathers the rows that
:func:`log_step` sends while a cell runs (in whichever process or Ray worker
runs it), and the runner writes them beside its store.
"""
from __future__ import annotations

import contextlib
import csv
import operator
import os
import pathlib

from . import written

COLUMNS = ("step", "loss", "lr", "grad_norm", "seconds")

_collector: list | None = None  # rows of the cell running in this process, when the runner collects them


def check_tensorboard():
    """TensorBoard's ``SummaryWriter``, or one line saying how to install it (checked before a run starts)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from ._checks import MissingDependency

        raise MissingDependency("--tensorboard needs the tensorboard package (pip install 'normlab[scale]')") from None
    return SummaryWriter


def _writer(tensorboard: str | os.PathLike | None, resume_step: int = 0):
    if tensorboard is None:
        return None
    writer = check_tensorboard()
    written.writable_folder(tensorboard, "--tensorboard")  # its writer's thread failed with a traceback
    # a resumed run trains the steps after its checkpoint again: TensorBoard drops what it logged for them (a run
    # killed before its first checkpoint too: it starts again from step 1, and its curve was drawn twice)
    return writer(str(tensorboard), purge_step=resume_step + 1)


class MetricsLog:
    """Append-only ``metrics.csv`` for one training run, resumable.

    Args:
        path: the CSV file (created with a header if absent).
        resume_step: rows with ``step > resume_step`` are dropped first (they were
            trained after the last checkpoint and will be trained again).
        tensorboard: a folder for TensorBoard event files, or None.
    """

    def __init__(self, path: str | os.PathLike, resume_step: int = 0, tensorboard: str | os.PathLike | None = None):
        self.path = pathlib.Path(path)
        self._tb = _writer(tensorboard, resume_step)  # first: a folder it cannot write leaves no metrics.csv begun
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw = _raw(self.path) if self.path.exists() else None
        rows = _parse(raw, self.path) if raw is not None else []
        kept = [r for r in rows if r["step"] <= resume_step]
        cut = raw is not None and not raw.endswith(("\n", "\r"))  # a row half written
        if raw is None or len(kept) != len(rows) or cut:
            write(self.path, kept)
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)

    def log(self, step: int, loss: float, lr: float, grad_norm: float, seconds: float) -> None:
        """One row; ``step`` a whole number (a tensor's ``tensor(1)`` or a float's ``2.0`` made the file
        unreadable at resume), TypeError here otherwise."""
        self._csv.writerow([operator.index(step), f"{loss:.6g}", f"{lr:.6g}", f"{grad_norm:.6g}", f"{seconds:.3f}"])
        self._file.flush()
        if self._tb is not None:
            for name, v in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm)):
                self._tb.add_scalar(f"train/{name}", v, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics.csv as dicts (``step`` int, the rest float). A last row without its line end (a write
    cut short by a kill, a full disk, a power loss) is left out: the run it logged resumes from its checkpoint."""
    return _parse(_raw(path), path)


def _parse(raw: str, path) -> list[dict]:
    """``read``'s rows of a metrics file's text ``raw`` (``path`` names it in the error). An empty file has no
    rows: a crash (a power loss after the file was made, before its header reached the disk) can leave one."""
    if not raw:
        return []
    rows = csv.DictReader(_whole_rows(raw).splitlines(keepends=True))
    try:
        if not set(COLUMNS) <= set(rows.fieldnames or ()):
            raise ValueError(f"columns {', '.join(rows.fieldnames or ())}")
        return [{c: int(r[c]) if c == "step" else float(r[c]) for c in COLUMNS} for r in rows]
    except (ValueError, TypeError) as e:  # a file of someone else's under the name, or edited by hand
        raise _not_metrics(path, str(e)[:100]) from None


def _raw(path) -> str:
    """The file's text with its line ends as written (BadValue for a file that is not text: no metrics file)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise _not_metrics(path, "not UTF-8 text") from None


def _not_metrics(path, why: str):
    """The one-line error for a file under a metrics file's name that is not one."""
    from ._checks import BadValue

    return BadValue(f"{path} is not a normlab metrics file ({why}; normlab writes {', '.join(COLUMNS)}): move it away")


def _whole_rows(text: str) -> str:
    """``text`` up to its last line end (all of it where it ends with one, or is one line: the header)."""
    if text.endswith(("\n", "\r")) or "\n" not in text:
        return text
    return text[: text.rindex("\n") + 1]


def write(path: str | os.PathLike, rows: list[dict]) -> None:
    """Write ``rows`` (dicts with :data:`COLUMNS`) as a metrics.csv, atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def to(tmp: pathlib.Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            w.writerows([[r[c] for c in COLUMNS] for r in rows])

    written.replace_whole(path, to)  # a temporary name of this process's own: two writers shared one


def active() -> bool:
    """True while :func:`collect` gathers rows in this process (a cell may skip computing metrics otherwise)."""
    return _collector is not None


def log_step(step: int, loss: float, lr: float, grad_norm: float, seconds: float) -> None:
    """Record one step of the cell running now; nothing happens outside :func:`collect`."""
    if _collector is not None:
        _collector.append({"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "seconds": seconds})


@contextlib.contextmanager
def collect():
    """``with collect() as rows:`` gathers what :func:`log_step` sends inside the block."""
    global _collector
    previous, _collector = _collector, []
    try:
        yield _collector
    finally:
        _collector = previous
