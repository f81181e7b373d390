"""``normlab.diarization.diarize``: the Python face of ``normlab diarize`` (same pipeline, same defaults).

>>> from normlab.diarization import diarize
>>> turns = diarize("meeting.wav", max_speakers=4)          # doctest: +SKIP
>>> turns = diarize({"waveform": wav, "sample_rate": 16000})  # doctest: +SKIP

Post-processing (threshold, median filter, windows, clustering threshold)
comes from the model file: ``diarize``, ``diarize_files`` and so the CLI
build the pipeline's settings with the one ``PipelineConfig.for_model`` from
their keyword options (None: the model file's), so they give the same turns
for the same model. ``to_annotation`` and ``from_annotation`` convert to
and from ``pyannote.core.Annotation`` (the ``annotation`` extra).
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import asdict

from ..._checks import BadValue, MissingDependency
from ..io.audio import SAMPLE_RATE, as_mono
from ..io.features import FeatureConfig
from ..io.rttm import Turn, write_rttm
from .cluster import check_speaker_counts
from .config import PipelineConfig
from .stitch import diarize_waveform


def load_model(model=None):
    """An ``EENDModel`` from ``None`` (the shipped one), a path, or a model; checks it fits the features."""
    from ..models.eend import SHIPPED, EENDModel

    if isinstance(model, EENDModel):
        m, where = model, "the given model"
    else:
        m, where = EENDModel.load(model), str(model if model is not None else SHIPPED)
    made = FeatureConfig()
    if m.features != made:
        diff = [k for k, v in asdict(made).items() if getattr(m.features, k) != v]
        theirs, ours = (", ".join(f"{k}={getattr(c, k)}" for k in diff) for c in (m.features, made))
        raise BadValue(f"{where} was trained on features with {theirs}; this pipeline makes {ours}")
    if m.cfg.input_dim != made.dim:
        raise BadValue(f"{where} expects {m.cfg.input_dim}-dim features; this pipeline makes {made.dim}")
    if not 1 <= m.cfg.n_speakers <= 8:
        raise BadValue(f"{where} has {m.cfg.n_speakers} local speakers; the pipeline supports 1-8")
    return m.eval()


def load_encoder(encoder=None):
    """The speaker encoder from ``None`` (Resemblyzer's installed weights), a weight file, or a module."""
    from ..models.embed import SpeakerEncoder

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
        ``window``, ``step``, ``cluster_threshold``, ...); None means "the model file's"

    All silence gives ``[]``; audio shorter than a window is one shorter window.
    """
    counts = {"num_speakers": num_speakers, "min_speakers": min_speakers, "max_speakers": max_speakers}
    check_speaker_counts(**counts)
    m = load_model(model)
    cfg = PipelineConfig.for_model(m, **options)
    return _diarize(audio, sample_rate, m, load_encoder(encoder), cfg, uri, counts)


def _diarize(audio, sample_rate, model, encoder, cfg: PipelineConfig, uri: str | None, counts: dict) -> list[Turn]:
    wave, name = as_mono(audio, sample_rate, SAMPLE_RATE)
    return diarize_waveform(model, encoder, wave, uri or name, cfg, **counts)


def diarize_files(paths: list, out_dir: str | pathlib.Path, *, num_speakers: int | None = None,
                  min_speakers: int | None = None, max_speakers: int | None = None, model=None, encoder=None,
                  progress: Callable[[int, int, str], None] | None = None, **options) -> dict[str, str]:
    """Write ``out_dir/<stem>.rttm`` per file; ``{path: "ok" | error}`` (one bad file never stops the rest).

    The speaker counts and ``options`` are ``diarize``'s. The model, the
    encoder and the pipeline's settings are made once; their errors, and bad
    options, raise.
    """
    counts = {"num_speakers": num_speakers, "min_speakers": min_speakers, "max_speakers": max_speakers}
    check_speaker_counts(**counts)
    m = load_model(model)
    cfg = PipelineConfig.for_model(m, **options)
    enc = load_encoder(encoder)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    status = {}
    for i, p in enumerate(paths):
        if progress:
            progress(i, len(paths), pathlib.Path(p).name)
        try:
            turns = _diarize(p, None, m, enc, cfg, None, counts)
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
