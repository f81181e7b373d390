"""Study runner: cells of a grid, a durable SQLite store, resumable, parallel.

A *cell* is a pure function ``fn(config) -> JSON-able dict`` with its seed in
its config. :meth:`Runner.map` looks each cell up in the store by its key (a
hash of the function's name and source, of normlab's own source (what the
cell calls: models, norms, kernels), the normlab and torch versions, the
config, the device and the torch thread count: an upgrade, an edited cell or
an edit to anything it calls never reuses stale results, and a cell is
bitwise repeatable for its key on one kind of CPU, docs/studies.md,
Reproducibility), runs only the
missing cells, and the driver writes each result as soon as it finishes: a
sweep killed at any moment loses at most the cells in flight, and re-running
skips the finished ones. Cells run in ``jobs`` local worker processes
(``executor="local"``) or as Ray tasks (``executor="ray"``, see
``ray_executor.py``); the store, resume and results are the same either way.
A cell that raises is recorded with status ``error`` and its message; the
sweep goes on, then ``map`` raises ``CellsFailed`` naming them (no study reads
an error as a result: a missing loss is not a divergence), and a re-run
retries them. Training cells report divergence
themselves (status ``diverged``, with the step): that is a result, kept.
The rows a training cell logs (``tracking.log_step``) are written to
``metrics/<study>/<fn>-<key>.csv`` beside the store, and what made them (the study, the cell, its key and
config, the versions) to the ``.json`` of the same name.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import os
import pathlib
import shutil
import sqlite3
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool

from .. import __version__, tracking, workers, written
from ..progress import Progress
from ..provenance import code_digest, versions

EXECUTORS = ("local", "ray")


@functools.lru_cache(maxsize=None)
def source_hash(fn: Callable) -> str:
    """Hash of a cell function's source (through decorators); its bytecode where the source is not available."""
    try:
        text = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        text = repr(inspect.unwrap(fn).__code__.co_code)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "unknown"


def cell_key(fn: Callable, config: dict, device: str = "cpu", threads: int = 1) -> str:
    """Stable hash of a cell: the function's name and source, normlab's source, the normlab and torch versions,
    the config, (other than the CPU) the device and (other than 1) the number of torch threads it runs with:
    float results depend on the thread count (docs/studies.md, Reproducibility), so a store never mixes them."""
    what = {"fn": f"{fn.__module__}.{fn.__qualname__}", "source": source_hash(fn), "code": code_digest(),
            "normlab": __version__, "torch": _torch_version(), "config": config,
            "kernels": "fixed table"}  # see _call
    if str(device) != "cpu":
        what["device"] = str(device)
    if threads != 1:
        what["threads"] = threads
    blob = json.dumps(what, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class Store:
    """SQLite tables ``cells(key, study, fn, config, status, result, seconds, finished)`` and
    ``sessions(started, provenance)`` (versions, commit and machine of each run that wrote to it)."""

    def __init__(self, path: str):
        from .._checks import BadValue

        self.path = path
        if os.path.isdir(path):
            raise BadValue(f"{path} is a folder where the store goes: move it away, or give --out another folder")
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:  # read before anything is changed
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            if "malformed" in str(e):  # a store cut short or overwritten in part
                raise BadValue(self._damaged(e)) from None
            disk = self._disk(e)
            if disk:
                raise BadValue(disk) from None
            raise BadValue(f"{path} is not a normlab store ({e}): give --out another folder, or move it away") \
                from None
        if tables and not {"cells", "sessions"} <= tables:  # someone's own database under the store's name
            raise BadValue(f"{path} is not a normlab store (it holds tables {', '.join(sorted(tables))}): give --out "
                           "another folder, or move it away")
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS cells (key TEXT PRIMARY KEY, study TEXT, fn TEXT, config TEXT,"
                " status TEXT, result TEXT, seconds REAL, finished REAL)"
            )
            db.execute("CREATE TABLE IF NOT EXISTS sessions (started REAL, provenance TEXT)")

    def add_session(self, provenance: dict) -> None:
        """Record who writes to the store from now on (``provenance.record()``)."""
        with self._db() as db:
            db.execute("INSERT INTO sessions VALUES (?, ?)", (time.time(), json.dumps(provenance, sort_keys=True)))

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    @contextlib.contextmanager
    def _db(self):
        """A transaction on the store (committed at the end); what the file or its folder refuses becomes one line
        naming the store: damaged after it was opened (a disk error, a partial copy), or not writable."""
        from .._checks import BadValue

        try:
            with contextlib.closing(self._connect()) as db, db:
                yield db
        except sqlite3.OperationalError as e:
            if "readonly" in str(e) or "unable to open" in str(e) or "locked" in str(e):
                raise BadValue(f"{self.path}: cannot write there ({e}): give --out another folder") from None
            raise BadValue(self._disk(e) or self._damaged(e)) from None
        except sqlite3.DatabaseError as e:
            raise BadValue(self._disk(e) or self._damaged(e)) from None

    def _disk(self, e: sqlite3.Error) -> str | None:
        """The line for an error of the disk under a sound store (full: SQLite says "disk I/O error" where it could
        not grow its journal), which "not a store" or "damaged" would have had the user throw away; else None."""
        if "disk I/O error" not in str(e) and "disk is full" not in str(e):
            return None
        try:
            free = f"; {shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free:,} bytes free there"
        except OSError:
            free = ""
        return f"{self.path}: cannot read or write it ({e}{free}): make room on its disk, or give --out another folder"

    def _damaged(self, why) -> str:
        return (f"{self.path} is damaged ({why}): move it away (its cells are then computed again), or give --out "
                "another folder")

    def get(self, key: str) -> dict | None:
        """A finished cell's result; ``None`` if it never ran or raised (a re-run retries errors)."""
        from .._checks import BadValue

        with self._db() as db:
            row = db.execute("SELECT status, result FROM cells WHERE key = ?", (key,)).fetchone()
        if row is None or row[0] == "error":
            return None
        try:
            sealed = json.loads(row[1])
        except (TypeError, ValueError) as e:  # a row changed on disk: the JSON a put wrote does not parse
            raise BadValue(self._damaged(f"cell {key}: {e}")) from None
        # valid JSON that is not what put wrote (edited, or another program's) reached the study, whose reading
        # of it stopped with a KeyError: each row carries the SHA-256 of its result
        result = sealed.get("result") if isinstance(sealed, dict) else None
        if not isinstance(result, dict) or sealed.get("sha256") != _sha256(result):
            raise BadValue(self._damaged(f"cell {key}: not the result that was stored"))
        return {"status": row[0], **result}

    def put(self, key: str, study: str, fn: str, config: dict, result: dict, seconds: float) -> None:
        status = result.get("status", "ok")
        result = json.loads(json.dumps(result))  # as it reads back (int keys become text, tuples lists)
        sealed = json.dumps({"result": result, "sha256": _sha256(result)})
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, study, fn, json.dumps(config, sort_keys=True), status, sealed, seconds, time.time()),
            )

    def count(self, study: str | None = None) -> int:
        with self._db() as db:
            if study is None:
                return db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            return db.execute("SELECT COUNT(*) FROM cells WHERE study = ?", (study,)).fetchone()[0]


def _sha256(result: dict) -> str:
    """The digest a stored result carries: of its JSON with sorted keys (what it reads back as, to the bit)."""
    return hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()


def _call(module: str, name: str, config: dict, threads: int, device: str = "cpu") -> tuple[dict, float, list[dict]]:
    """Run one cell (in a worker, a Ray task or in-process) on ``device``: ``(result, seconds, metrics rows)``.

    The cell runs with ``threads`` torch threads, torch's deterministic algorithms (on a GPU, atomics-based
    kernels such as the embedding's backward would otherwise reorder sums from run to run) and the norms'
    fixed dispatch table (``auto``'s measured choice between two kernels follows the machine's timing, a tie can
    go either way from run to run, and the two kernels round differently; the diarization placement claims
    turn on such rounding at this size, docs/studies.md); the caller's settings are restored afterwards.
    Exceptions become an ``error`` result.
    """
    import torch

    from ..devices import default_device
    from ..kernels import autotune

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (read at its first use)
    fn = getattr(importlib.import_module(module), name)
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)  # an op without a deterministic kernel warns
    tuned = autotune.set_autotune(False)
    t0 = time.perf_counter()
    try:
        with tracking.collect() as rows, default_device(device):
            try:
                result = fn(config)
            except Exception as e:  # noqa: BLE001 - a failing cell is recorded, never fatal to the sweep
                result = {"status": "error", "error": f"{type(e).__name__}: {e}",
                          "trace": traceback.format_exc()[-2000:]}
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1], warn_only=before[2])
        autotune.set_autotune(tuned)
    return result, time.perf_counter() - t0, rows


class Runner:
    """Maps cell functions over configs with the store, ``jobs`` workers and a progress bar.

    ``executor``: ``"local"`` (worker processes on this machine) or ``"ray"``
    (Ray tasks; ``address`` None starts a local Ray instance with ``jobs`` CPUs,
    ``"auto"`` or ``HOST:PORT`` joins a running cluster).
    """

    def __init__(self, store: Store, jobs: int = 1, progress: Progress | None = None, executor: str = "local",
                 address: str | None = None, device: str = "cpu"):
        from .._checks import check_choice

        check_choice(executor, EXECUTORS, "executor")
        self.store, self.jobs = store, max(1, jobs)
        self.progress = progress or Progress(enabled=False)
        self.executor, self.address, self.device = executor, address, str(device)
        self._ray = None  # started on the first cell that must run
        self.ran = 0  # cells computed (not found in the store) by this runner
        # this run of the command: a measurement that holds only for the moment it was made (a timing) puts it in
        # its cells' configs, so a later run measures again instead of reading a busy moment back for good
        self.run_id = f"{time.time():.6f}-{os.getpid()}"

    @property
    def threads(self) -> int:
        """torch threads per cell: 1 beside other workers (``jobs`` > 1, or one CPU per Ray task), else 2."""
        return 1 if self.executor == "ray" or self.jobs > 1 else 2

    def map(self, study: str, fn: Callable, configs: list[dict]) -> list[dict]:
        keys = [cell_key(fn, c, self.device, self.threads) for c in configs]
        results: dict[str, dict] = {}
        todo: dict[str, dict] = {}  # key -> config, each distinct missing cell once
        for k, c in zip(keys, configs):
            if k in results or k in todo:
                continue
            hit = self.store.get(k)
            if hit is not None:
                results[k] = hit
            else:
                todo[k] = c
        total, done = len(set(keys)), len(results)
        self.progress.show(study, done, total, "(resumed)" if done else "")
        for k, c, result, secs, rows in self._execute(fn, todo):
            self._record(study, fn, k, c, result, secs, results, rows)
            done += 1
            self.progress.show(study, done, total, _label(c))
        failed = [(c, results[k]) for k, c in todo.items() if results[k]["status"] == "error"]
        if failed:
            from .._checks import CellsFailed

            (c, first), n = failed[0], len(failed)
            where = _label(c) or "its only cell"
            error = (first.get("error") or "?").splitlines()[0]  # the message is one line
            raise CellsFailed(f"{n} of {total} cell{'s' * (total != 1)} of {study} failed (first, {where}: "
                              f"{error}); the finished cells are kept: run the same command again to retry the "
                              "failed ones")
        return [results[k] for k in keys]

    def _execute(self, fn: Callable, todo: dict[str, dict]) -> Iterator[tuple]:
        """Run the missing cells; yields ``(key, config, result, seconds, rows)`` as each finishes."""
        if not todo:
            return
        if self.executor == "ray":
            if self._ray is None:
                from .ray_executor import RayExecutor

                self._ray = RayExecutor(self.address, self.jobs)
            yield from self._ray.run(_call, fn, todo, self.device)
            return
        threads = self.threads
        if self.jobs == 1 or len(todo) <= 1:
            for k, c in todo.items():
                yield (k, c, *_call(fn.__module__, fn.__qualname__, c, threads, self.device))
            return
        # on an interrupt or an error the queued cells are dropped and those in flight stopped (workers.pool), not
        # computed first and then lost
        with workers.pool(self.jobs) as pool:
            pending = {pool.submit(_call, fn.__module__, fn.__qualname__, c, threads, self.device): (k, c)
                       for k, c in todo.items()}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    k, c = pending.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool:  # a worker killed (by a signal, or for memory): not a bug here
                        from .._checks import Unavailable

                        raise Unavailable(f"a worker process died while the cells of {fn.__qualname__} ran (killed, "
                                          "or out of memory); the finished cells are kept: run the same command "
                                          "again to resume") from None
                    yield (k, c, *result)

    def close(self) -> None:
        """Stop the Ray instance this runner started (if any)."""
        if self._ray is not None:
            self._ray.close()
            self._ray = None

    def _record(self, study, fn, key, config, result, secs, results, rows=()):
        if rows:  # first: a cell in the store is never run again, so its rows must be on disk before it is
            folder = pathlib.Path(self.store.path).parent / "metrics" / study
            csv = folder / f"{fn.__qualname__}-{key[:12]}.csv"
            tracking.write(csv, rows)
            # what made the rows, beside them (the CSV stays plain columns that any reader takes); the versions are
            # the runner's, which its workers share
            made = {"study": study, "cell": fn.__qualname__, "key": key, "config": config, "seconds": secs,
                    "versions": {**versions(), "source_digest": code_digest()}}
            text = json.dumps(made, indent=1, sort_keys=True, default=str) + "\n"
            written.replace_whole(csv.with_suffix(".json"), lambda tmp: tmp.write_text(text, encoding="utf-8"))
        self.store.put(key, study, fn.__qualname__, config, result, secs)
        results[key] = {"status": result.get("status", "ok"), **result}
        self.ran += 1


def _label(config: dict) -> str:
    """The short settings of a cell (long ones, such as paths and nested dicts, left out)."""
    return " ".join(f"{k}={v}" for k, v in config.items() if k != "steps" and len(str(v)) <= 24)
