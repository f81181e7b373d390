"""matplotlib for normlab's figures: one import rule for the studies and the diarization timelines."""
from __future__ import annotations

from ._checks import MissingDependency


def pyplot(needed_for: str):
    """matplotlib's pyplot on the headless Agg backend; without matplotlib, one line naming the extra:
    ``"<needed_for> need matplotlib: pip install 'normlab[plot]'"``."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency(f"{needed_for} need matplotlib: pip install 'normlab[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
