"""Studies: each module checks claims of the lessons and papers (``docs/studies.md`` states each one).

A study module has ``NAME``, ``TITLE`` and ``run(ctx) -> {"name", "title", "claims", "figure"}``.
"""
from __future__ import annotations

import importlib

#: study name -> module, in report order (cheap first)
STUDIES = ("lesson_stats", "invariance", "structure", "rms_speed", "init_depth", "update_size", "training",
           "diarization")


def load(name: str):
    from .._checks import check_choice

    check_choice(name, STUDIES, "study")
    return importlib.import_module(f"{__name__}.{name}")
