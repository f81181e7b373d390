"""``normlab.diarization.diarize``: the Python face of ``normlab diarize`` (same pipeline, same defaults).

>>> from normlab.diarization import diarize
>>> turns = diarize("meeting.wav", max_speakers=4)          # doctest: +SKIP
>>> turns = diarize({"waveform": wav, "sample_rate": 16000})  # doctest: +SKIP

Post-processing (threshold, median filter, windows, clustering threshold)
comes from the model file (``PipelineConfig.for_model``), so the API and the
CLI give the same turns for the same model. ``to_annotation`` and
``from_annotation`` convert to and from ``pyannote.core.Annotation``
(the ``annotation`` extra).
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable

from .._checks import BadValue, MissingDependency
from .cluster import check_speaker_counts
from .features import FeatureConfig
from .rttm import Turn, write_rttm

SAMPLE_RATE = 16000  # the pipeline's input rate (the speaker encoder's); EEND features are made at 8 kHz


def load_model(model=None):
    """An ``EENDModel`` from ``None`` (the shipped one), a path, or a model; checks it fits the features."""
    from .model import SHIPPED, EENDModel

    if isinstance(model, EENDModel):
        m, where = model, "the given model"
    else:
        m, where = EENDModel.load(model), str(model if model is not None else SHIPPED)
    dim = FeatureConfig().dim
    if m.cfg.input_dim != dim:
        raise BadValue(f"{where} expects {m.cfg.input_dim}-dim features; this pipeline makes {dim}")
    if not 1 <= m.cfg.n_speakers <= 8:
        raise BadValue(f"{where} has {m.cfg.n_speakers} local speakers; the pipeline supports 1-8")
    return m.eval()


def load_encoder(encoder=None):
    """The speaker encoder from ``None`` (Resemblyzer's installed weights), a weight file, or a module."""
    from .embed import SpeakerEncoder

    return encoder if isinstance(encoder, SpeakerEncoder) else SpeakerEncoder.load(encoder)


def diarize(audio, *, sample_rate: int | None = None, num_speakers: int | None = None,
            min_speakers: int | None = None, max_speakers: int | None = None, model=None, encoder=None,
            uri: str | None = None, **options) -> list[Turn]:
    """Who spoke when: speaker turns (``Turn(uri, start, duration, speaker)``, sorted) of one recording.

    Parameters
    ----------
    audio : a WAV/FLAC path; a numpy array or torch tensor ``(channels, samples)`` or ``(samples,)``
        with ``sample_rate``; or ``{"waveform": (channels, samples), "sample_rate": int}``
    num_speakers, min_speakers, max_speakers : the speaker count if known, exact or bounded
    model : None (the model shipped with normlab), a model file, or an ``EENDModel``
    encoder : None (the GE2E weights of ``resemblyzer==0.1.4``), a weight file, or a ``SpeakerEncoder``
    uri : the recording's name in the turns (default: the file's stem, or ``"audio"``)
    options : ``PipelineConfig`` fields overriding the model file's (``threshold``, ``median``,
        ``window``, ``step``, ``cluster_threshold``, ...)

    All silence gives ``[]``; audio shorter than a window is one shorter window.
    """
    from .audio import as_mono
    from .pipeline import PipelineConfig, diarize_waveform

    check_speaker_counts(num_speakers, min_speakers, max_speakers)
    m = load_model(model)
    cfg = PipelineConfig.for_model(m, **options)
    enc = load_encoder(encoder)
    wave, name = as_mono(audio, sample_rate, SAMPLE_RATE)
    return diarize_waveform(m, enc, wave, uri or name, cfg, num_speakers=num_speakers, min_speakers=min_speakers,
                            max_speakers=max_speakers)


def diarize_files(paths: list, out_dir: str | pathlib.Path, *, model=None, encoder=None,
                  progress: Callable[[int, int, str], None] | None = None, **kw) -> dict[str, str]:
    """Write ``out_dir/<stem>.rttm`` per file; ``{path: "ok" | error}`` (one bad file never stops the rest).

    ``kw`` are ``diarize``'s keywords (speaker counts, pipeline options). The
    model and the encoder are loaded once; their errors, and bad options, raise.
    """
    check_speaker_counts(kw.get("num_speakers"), kw.get("min_speakers"), kw.get("max_speakers"))
    m, enc = load_model(model), load_encoder(encoder)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    status = {}
    for i, p in enumerate(paths):
        if progress:
            progress(i, len(paths), pathlib.Path(p).name)
        try:
            turns = diarize(p, model=m, encoder=enc, **kw)
            write_rttm(turns, out_dir / f"{pathlib.Path(p).stem}.rttm")
            status[str(p)] = "ok"
        except (ValueError, OSError) as e:  # AudioError and friends: reported per file
            status[str(p)] = str(e)
    return status


def to_annotation(turns: list[Turn], uri: str | None = None):
    """A ``pyannote.core.Annotation`` of the turns (needs ``pip install normlab[annotation]``)."""
    try:
        from pyannote.core import Annotation, Segment
    except ImportError:
        raise MissingDependency("to_annotation needs pyannote.core: pip install 'normlab[annotation]'") from None
    uri = uri or (turns[0].uri if turns else None)
    ann = Annotation(uri=uri)
    for i, t in enumerate(sorted(turns)):
        ann[Segment(t.start, t.end), i] = t.speaker
    return ann


def from_annotation(annotation, uri: str | None = None) -> list[Turn]:
    """Turns of a ``pyannote.core.Annotation`` (speaker labels as strings, spaces replaced by ``_``)."""
    uri = uri or annotation.uri or "audio"
    return sorted(Turn(uri, float(seg.start), float(seg.end - seg.start), str(label).replace(" ", "_"))
                  for seg, _, label in annotation.itertracks(yield_label=True))


__all__ = ["diarize", "diarize_files", "load_model", "load_encoder", "to_annotation", "from_annotation"]
