"""Study runner: cells of a grid, a durable SQLite store, resumable, parallel.

A *cell* is a pure function ``fn(config) -> JSON-able dict`` with its seed in
its config. :meth:`Runner.map` looks each (function, config) up in the store
by a hash of both, runs only the missing cells (in ``jobs`` worker processes),
and writes each result as soon as it finishes: a sweep killed at any moment
loses at most the cells in flight, and re-running skips the finished ones.
A cell that raises is recorded with status ``error`` and its message; the
sweep goes on. Training cells report divergence themselves (status
``diverged``, with the step).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import multiprocessing as mp
import sqlite3
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from ..progress import Progress


def cell_key(fn: Callable, config: dict) -> str:
    """Stable hash of a cell: the function's qualified name and its config."""
    blob = json.dumps({"fn": f"{fn.__module__}.{fn.__qualname__}", "config": config}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class Store:
    """SQLite table ``cells(key, study, fn, config, status, result, seconds, finished)``."""

    def __init__(self, path: str):
        self.path = path
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS cells (key TEXT PRIMARY KEY, study TEXT, fn TEXT, config TEXT,"
                " status TEXT, result TEXT, seconds REAL, finished REAL)"
            )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def get(self, key: str) -> dict | None:
        """A finished cell's result; ``None`` if it never ran or raised (a re-run retries errors)."""
        with self._connect() as db:
            row = db.execute("SELECT status, result FROM cells WHERE key = ?", (key,)).fetchone()
        if row is None or row[0] == "error":
            return None
        return {"status": row[0], **json.loads(row[1])}

    def put(self, key: str, study: str, fn: str, config: dict, result: dict, seconds: float) -> None:
        status = result.get("status", "ok")
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, study, fn, json.dumps(config, sort_keys=True), status, json.dumps(result), seconds, time.time()),
            )

    def count(self, study: str | None = None) -> int:
        with self._connect() as db:
            if study is None:
                return db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            return db.execute("SELECT COUNT(*) FROM cells WHERE study = ?", (study,)).fetchone()[0]


def _call(module: str, name: str, config: dict, threads: int) -> tuple[dict, float]:
    """Run one cell (in a worker or in-process); exceptions become an ``error`` result."""
    import torch

    torch.set_num_threads(threads)
    fn = getattr(importlib.import_module(module), name)
    t0 = time.perf_counter()
    try:
        result = fn(config)
    except Exception as e:  # noqa: BLE001 - a failing cell is recorded, never fatal to the sweep
        result = {"status": "error", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    return result, time.perf_counter() - t0


class Runner:
    """Maps cell functions over configs with the store, ``jobs`` processes and a progress bar."""

    def __init__(self, store: Store, jobs: int = 1, progress: Progress | None = None):
        self.store, self.jobs = store, max(1, jobs)
        self.progress = progress or Progress(enabled=False)
        self.ran = 0  # cells computed (not found in the store) by this runner

    def map(self, study: str, fn: Callable, configs: list[dict]) -> list[dict]:
        keys = [cell_key(fn, c) for c in configs]
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
        threads = 1 if self.jobs > 1 else 2
        if self.jobs == 1 or len(todo) <= 1:
            for k, c in todo.items():
                self.progress.show(study, done, total, _label(c))
                result, secs = _call(fn.__module__, fn.__qualname__, c, threads)
                self._record(study, fn, k, c, result, secs, results)
                done += 1
                self.progress.show(study, done, total, _label(c))
        else:
            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(self.jobs, mp_context=ctx) as pool:
                pending = {pool.submit(_call, fn.__module__, fn.__qualname__, c, threads): (k, c)
                           for k, c in todo.items()}
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        k, c = pending.pop(fut)
                        result, secs = fut.result()
                        self._record(study, fn, k, c, result, secs, results)
                        done += 1
                        self.progress.show(study, done, total, _label(c))
        return [results[k] for k in keys]

    def _record(self, study, fn, key, config, result, secs, results):
        self.store.put(key, study, fn.__qualname__, config, result, secs)
        results[key] = {"status": result.get("status", "ok"), **result}
        self.ran += 1


def _label(config: dict) -> str:
    """The short settings of a cell (long ones, such as paths and nested dicts, left out)."""
    return " ".join(f"{k}={v}" for k, v in config.items() if k != "steps" and len(str(v)) <= 24)
