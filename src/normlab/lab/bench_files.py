"""``normlab bench``'s outputs: the measured result, its table and its figure, written into one folder.

``measure`` runs what the options ask for (the norms' CPU table with the GPU section, ``--dispatch``'s
decisions or ``--model``'s encoder) and returns the result, with the provenance and the environment that
changes the timings, and its Markdown table; ``write`` puts ``STEM.json``, ``STEM.md`` and, where matplotlib
is installed, ``STEM.png`` into the folder.
"""
from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable

from .. import provenance, written

#: environment variables that change what the bench measures (recorded with every result): normlab's own, the
#: compiler of its kernels (CXX), where its caches live (XDG_CACHE_HOME), torch's instruction set and threads, and
#: the allocator's (glibc's MALLOC_* and GLIBC_TUNABLES: they moved a case from 34-40% to 98% of the floor)
SETTINGS_ENV = ("NORMLAB_AUTOTUNE", "NORMLAB_DISPATCH_FILE", "NORMLAB_STREAM_BYTES", "NORMLAB_CXXFLAGS",
                "NORMLAB_KEEP_FREED", "NORMLAB_CACHE_DIR", "CXX", "XDG_CACHE_HOME", "ATEN_CPU_CAPABILITY",
                "OMP_NUM_THREADS", "GLIBC_TUNABLES")
#: prefixes of such variables (every one set is recorded)
SETTINGS_PREFIXES = ("MALLOC_",)


def stem(kind: str) -> str:
    """The files' name: ``bench``, ``bench-dispatch`` or ``bench-model``."""
    return {"norms": "bench", "dispatch": "bench-dispatch", "model": "bench-model"}[kind]


def outputs(out: str | os.PathLike, kind: str) -> list[pathlib.Path]:
    """What :func:`write` writes for ``kind``: the result, the table, the figure."""
    return [pathlib.Path(out) / f"{stem(kind)}{ext}" for ext in (".json", ".md", ".png")]


def _kernels() -> dict:
    """Whether normlab's C++ kernels ran, and why not where they did not (a failed build fell back quietly)."""
    from ..kernels import cpu

    return {"available": cpu.available(), **({} if cpu.available() else {"why": cpu.unavailable_reason()})}


def measure(kind: str, *, ops=None, shapes=None, dtypes=None, repeats: int = 15, cold_start: bool = False,
            cpu_table: bool = True, device=None, compiled: bool = False, profile: bool = False,
            progress: Callable | None = None) -> tuple[dict, str]:
    """Run the bench of ``kind`` (``norms``, ``dispatch`` or ``model``); returns ``(result, Markdown table)``.
    ``norms``: the CPU table where ``cpu_table``, and the GPU section where ``device`` is a CUDA device."""
    from . import bench, bench_dispatch, bench_gpu, bench_model

    if kind == "model":
        result = bench_model.run(repeats=repeats, compiled=compiled, profile=profile, progress=progress)
        table = bench_model.markdown(result)
    elif kind == "dispatch":
        result = bench_dispatch.run(ops, shapes, dtypes, progress=progress)
        table = bench_dispatch.markdown(result)
    else:
        result = bench.run(ops, shapes, dtypes, repeats=repeats, progress=progress) if cpu_table else {"rows": []}
        if cpu_table:
            result["cold_start_s"] = bench.cold_start_seconds() if cold_start else None
        if device is not None and device.type == "cuda":
            result["gpu"] = bench_gpu.run(device, progress=progress)
        else:
            result["gpu"] = {"skipped": bench_gpu.available() or "--device cpu: GPU section skipped"}
        table = "\n\n".join(([bench.markdown(result)] if result["rows"] else []) + [bench_gpu.markdown(result["gpu"])])
    result["kernels"] = _kernels()
    result["environment"] = {k: os.environ[k] for k in SETTINGS_ENV if k in os.environ} | {
        k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_PREFIXES)}
    result["provenance"] = prov = provenance.record()
    notes = [f"Made by {provenance.describe(prov)}."]
    if not result["kernels"]["available"]:
        notes.append(f"normlab's C++ kernels did not run here ({result['kernels']['why']}): its column is the "
                     "fallback's.")
    if result["environment"]:
        notes.append("Environment: " + ", ".join(f"{k}={v}" for k, v in result["environment"].items()) + ".")
    return result, table + "\n\n" + " ".join(notes)


def write(out: str | os.PathLike, kind: str, result: dict, table: str) -> list[pathlib.Path]:
    """Write the result (JSON), the table (Markdown) and the figure (PNG, where matplotlib is installed and the
    result has something to draw) into ``out``; returns the files written."""
    from .bench_figure import draw

    data, md, png = outputs(out, kind)
    # the figure first, into a temporary: on a full disk it fails first (the largest file), named, and nothing of
    # this run is left (the JSON and the table were left without their figure, the error naming no file)
    tmp = written.temporary(png, os.getpid())
    try:
        try:
            with written.full_disk_said(png, tmp):
                drawn = draw(kind, result, tmp)
        except OSError as e:
            if e.filename is None:  # matplotlib's write error names no file
                raise OSError(e.errno, e.strerror, str(png)) from e
            raise
        written.write_text(data, json.dumps(result, indent=2))
        written.write_text(md, table + "\n")
        files = [data, md]
        if drawn:
            os.replace(tmp, png)
            written.record(png)
            files.append(png)
        else:  # a figure of an earlier run (normlab's, or --overwrite: checked before measuring) would stand beside
            png.unlink(missing_ok=True)  # this run's numbers as if it drew them
    finally:
        tmp.unlink(missing_ok=True)
    return files
