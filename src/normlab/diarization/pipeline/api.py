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

``diarize`` returns a ``Diarization`` (``output.py``): the list of turns, with
``.exclusive()``, ``.to_rttm()``, ``.to_json()``, the settings and the
provenance of the models; ``diarize_files`` writes it as RTTM or JSON, and a
timeline PNG with ``plot=True``.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import math
import os
import pathlib
import warnings
from collections.abc import Callable
from dataclasses import asdict

from ... import written
from ..._checks import BadType, BadValue, MissingDependency, UserError, check_flag
from ..io.audio import SAMPLE_RATE, as_field, as_mono, recording_uri
from ..io.features import FeatureConfig
from ..io.rttm import Turn, check_token, check_turns, read_rttm
from .cluster import check_speaker_counts
from .config import PipelineConfig
from .output import FORMATS, Diarization, render
from .stitch import diarize_waveform


def load_model(model=None):
    """An ``EENDModel`` from ``None`` (the shipped one), a path, or a model; checks it fits the features."""
    from ..models.eend import MAX_LOCAL_SPEAKERS, EENDModel, model_path

    if isinstance(model, EENDModel):
        m, where = model, "the given model"
    elif model is not None and not isinstance(model, (str, os.PathLike)):
        raise BadType(f"model must be None (the shipped model), a model file's path or an EENDModel, got "
                      f"{type(model).__name__}")
    else:
        path = model_path(model)  # (a shipped model's name: its file)
        m, where = EENDModel.load(path), str(path)
        m.source_path = path  # for the provenance
    made = FeatureConfig()
    if m.features != made:
        diff = [k for k, v in asdict(made).items() if getattr(m.features, k) != v]
        theirs, ours = (", ".join(f"{k}={getattr(c, k)!r}" for k in diff) for c in (m.features, made))
        raise BadValue(f"{where} was trained on features with {theirs}; this pipeline makes {ours}")
    if m.cfg.input_dim != made.dim:
        raise BadValue(f"{where} expects {m.cfg.input_dim}-dim features; this pipeline makes {made.dim}")
    if not 1 <= m.cfg.n_speakers <= MAX_LOCAL_SPEAKERS:
        raise BadValue(f"{where} has {m.cfg.n_speakers} local speakers; the pipeline supports 1-{MAX_LOCAL_SPEAKERS}")
    return m.eval()


def load_encoder(embedding=None, kind: str = "ge2e"):
    """The speaker encoder of ``kind`` ("ge2e" or "campplus", ``PipelineConfig.speaker_encoder``) from ``None``
    (its weights shipped with normlab) or a weight file; or the encoder module given."""
    from ..models import campplus, embed

    if isinstance(embedding, (embed.SpeakerEncoder, campplus.CAMPlusEncoder)):
        return embedding
    if embedding is not None and not isinstance(embedding, (str, os.PathLike)):
        raise BadType(f"embedding must be None (the shipped weights), a weights file's path or a speaker encoder, "
                      f"got {type(embedding).__name__}")
    module = {"ge2e": embed, "campplus": campplus}.get(kind)
    if module is None:
        raise BadValue(f"speaker encoder must be 'ge2e' or 'campplus', got {kind!r}")
    enc = (embed.SpeakerEncoder if module is embed else campplus.CAMPlusEncoder).load(embedding)
    enc.source_path = pathlib.Path(embedding) if embedding is not None else module.weights_path()  # provenance
    return enc


def every_encoder(embedding=None) -> dict:
    """``{name: encoder}`` of every speaker encoder, GE2E first (from ``embedding``'s weights, else the shipped
    ones): what ``tune_pipeline`` takes to try each on the grid's choice."""
    from .config import SPEAKER_ENCODERS

    return {kind: load_encoder(embedding if kind == "ge2e" else None, kind) for kind in SPEAKER_ENCODERS}


def _no_old_keywords(options: dict) -> None:
    if "encoder" in options:  # renamed as the CLI's --embedding (the EEND model's own encoder is ModelConfig.encoder)
        raise BadType("encoder= is now embedding= (the speaker encoder's weights, as the CLI's --embedding)")


@functools.lru_cache(maxsize=16)
def _file_record(path: str, stat: tuple) -> dict:
    from ..models.weights import ASSETS, is_safetensors, safetensors_metadata, sha256

    p = pathlib.Path(path)
    shipped = p.resolve().parent == ASSETS
    rec = {"file": f"normlab/diarization/assets/{p.name}" if shipped else str(p), "sha256": sha256(p)}
    if is_safetensors(p):
        rec.update({k: v for k, v in safetensors_metadata(p).items() if k in ("source", "source_sha256", "license")})
    return rec


def _record(path) -> dict | None:
    """File, SHA-256 and (safetensors) source of a weight file; None for a module given without one."""
    if path is None:
        return None
    st = pathlib.Path(path).stat()  # (a file replaced with its old time kept, cp -p: its size, inode, ctime change)
    return dict(_file_record(str(path), (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)))


def provenance(model, encoder, cfg: PipelineConfig) -> dict:
    """normlab's version and the segmentation model, speaker encoder and VAD files that ``cfg`` runs with."""
    from ... import __version__
    from ..models.vad import installed_weights

    return {"normlab": __version__, "model": _record(getattr(model, "source_path", None)),
            "embedding": _record(getattr(encoder, "source_path", None)),
            "vad": None if cfg.vad == "off" else _record(installed_weights())}


def diarize(audio, *, sample_rate: int | None = None, num_speakers: int | None = None,
            min_speakers: int | None = None, max_speakers: int | None = None, model=None, embedding=None,
            uri: str | None = None, exclusive: bool = False, **options) -> Diarization:
    """Who spoke when: the speaker turns (``Turn(uri, start, duration, speaker)``, sorted) of one recording.

    Parameters
    ----------
    audio : a WAV/FLAC path; a numpy array or torch tensor ``(channels, samples)`` or ``(samples,)``
        with ``sample_rate``; or ``{"waveform": (channels, samples), "sample_rate": int}``
    num_speakers, min_speakers, max_speakers : the speaker count if known, exact or bounded
    model : None (the model shipped with normlab), a model file, or an ``EENDModel``
    embedding : the speaker encoder's weights: None (those shipped for ``speaker_encoder``: GE2E, from
        ``resemblyzer==0.1.4``, or CAM++, from 3D-Speaker), a weight file of that encoder, or the encoder module
    uri : the recording's name in the turns (default: the file's stem, or ``"audio"``)
    exclusive : one speaker at a time (``Diarization.exclusive()``: overlap goes to the one already talking)
    options : ``PipelineConfig`` fields overriding the model file's (``threshold``, ``median``,
        ``window``, ``step``, ``cluster_threshold``, ...); None means "the model file's"

    Returns a ``Diarization``: a list of the turns (all silence gives an empty one) that also carries the
    settings and the models' provenance (``.to_json()``, ``.to_rttm()``). Audio shorter than a window is
    one shorter window.
    """
    if uri is not None:  # checked before any work, as the RTTM writer would check it after all of it
        check_token(uri, "uri")
    check_flag(exclusive, "exclusive")
    m, enc, cfg, counts, prov = _prepare(model, embedding, num_speakers, min_speakers, max_speakers, options)
    result = _diarize(audio, sample_rate, m, enc, cfg, uri, counts, prov)
    return result.exclusive() if exclusive else result


def _prepare(model, embedding, num_speakers, min_speakers, max_speakers, options: dict):
    """The model, the encoder, the settings, the speaker counts and the provenance, checked once per call."""
    _no_old_keywords(options)
    counts = {"num_speakers": num_speakers, "min_speakers": min_speakers, "max_speakers": max_speakers}
    check_speaker_counts(**counts)
    m = load_model(model)
    try:
        cfg = PipelineConfig.for_model(m, **options)
    except BadValue as e:
        try:
            PipelineConfig.for_model(m)  # the file's own settings alone: are they the fault?
        except BadValue:
            raise BadValue(f"{getattr(m, 'source_path', 'the given model')}: its stored pipeline settings: {e}") \
                from None
        raise
    try:
        enc = load_encoder(embedding, cfg.speaker_encoder)
    except BadValue as e:
        if embedding is None or not isinstance(embedding, (str, os.PathLike)):
            raise
        other = "ge2e" if cfg.speaker_encoder == "campplus" else "campplus"
        raise BadValue(f"{e} (the settings embed with {cfg.speaker_encoder}; weights of the other encoder need "
                       f"--speaker-encoder {other}, speaker_encoder={other!r} in Python)") from None
    if getattr(enc, "name", cfg.speaker_encoder) != cfg.speaker_encoder:
        raise BadValue(f"the speaker encoder given is {enc.name}, the settings are for {cfg.speaker_encoder} "
                       f"(speaker_encoder={enc.name!r} chooses its settings)")
    return m, enc, cfg, counts, provenance(m, enc, cfg)


def made_with(*, model=None, embedding=None, num_speakers: int | None = None, min_speakers: int | None = None,
              max_speakers: int | None = None, **options) -> dict:
    """``{"settings", "provenance"}`` that ``diarize`` and ``diarize_files`` run with for these arguments (what
    a result made by them records: the settings, normlab's version and the model files with their SHA-256)."""
    m, enc, cfg, counts, prov = _prepare(model, embedding, num_speakers, min_speakers, max_speakers, options)
    return {"settings": {**asdict(cfg), **counts}, "provenance": prov}


def _diarize(audio, sample_rate, model, encoder, cfg: PipelineConfig, uri: str | None, counts: dict,
             prov: dict) -> Diarization:
    wave, name = as_mono(audio, sample_rate, SAMPLE_RATE)
    duration = round(wave.numel() / SAMPLE_RATE, 3)
    turns = diarize_waveform(model, encoder, wave, uri or name, cfg, **counts)  # (none past the audio's end)
    asked = counts["num_speakers"] or counts["min_speakers"]
    found = len({t.speaker for t in turns})
    if asked and found < asked:  # a cluster is made for each, but a speaker who never wins a frame has no turn
        warnings.warn(f"{uri or name}: {found} speaker{'s' * (found != 1)} found where "
                      f"{'exactly' if counts['num_speakers'] else 'at least'} {asked} were asked for: too little "
                      "speech to tell more apart, or the others' frames did not pass the threshold and filter",
                      UserWarning, stacklevel=3)
    return Diarization(turns, uri=uri or name, duration=duration,
                       settings={**asdict(cfg), **counts}, provenance=prov)


def outputs(path, out_dir: str | pathlib.Path, format: str = "rttm", plot: bool = False) -> list[pathlib.Path]:
    """What :func:`diarize_files` writes for the input ``path``: its result, then its timeline (``plot``)."""
    uri, out_dir = recording_uri(path), pathlib.Path(out_dir)
    return [out_dir / f"{uri}{FORMATS[format]}"] + ([out_dir / f"{uri}.png"] if plot else [])


#: what :func:`diarize_files` says of a file that succeeded: diarized and written, or kept as written before
DONE = ("ok", "kept")


def diarize_files(paths: list, out_dir: str | pathlib.Path, *, num_speakers: int | None = None,
                  min_speakers: int | None = None, max_speakers: int | None = None, model=None, embedding=None,
                  format: str = "rttm", exclusive: bool = False, plot: bool = False, overwrite: bool = False,
                  progress: Callable[[int, int, str], None] | None = None,
                  on_result: Callable[[str, Diarization], None] | None = None, **options) -> dict[str, str]:
    """Write ``out_dir/<stem>.rttm`` (or ``.json``, ``format="json"``) per file, and ``out_dir/<stem>.png``
    (a timeline, ``plot=True``); ``{path: "ok" | "kept" | error}`` (one bad file never stops the rest).
    ``on_result(path, diarization)`` is called with each file's result once it is written (what was found:
    its speakers, settings and provenance, without reading the file back).

    A stopped run resumes: a file whose outputs normlab wrote from the same audio bytes, settings, speaker
    counts, format and model files (their SHA-256, and normlab's version), each unchanged since, is not
    diarized again (``"kept"``; its result is read back for ``on_result``). The folder's list of what normlab
    wrote (:mod:`normlab.written`) holds, beside each output, a digest of what made it.

    The speaker counts, ``exclusive`` and ``options`` are ``diarize``'s. The model, the encoder and the
    pipeline's settings are made once; their errors, bad options and a missing matplotlib (``plot``) raise.
    An output that exists already is replaced only where normlab wrote it and it is unchanged since
    (:mod:`normlab.written`), or with ``overwrite``; never beside its own audio.
    """
    for name, flag in (("exclusive", exclusive), ("plot", plot), ("overwrite", overwrite)):
        check_flag(flag, name)  # overwrite="no" replaced a user's file
    if format not in FORMATS:
        raise BadValue(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(paths, (dict, bytes)):  # a dict's keys, a name's bytes: not files (an array's items are checked)
        raise BadType(f"diarize_files takes paths of audio files, got {type(paths).__name__} (diarize() takes a "
                      "waveform: an array, a tensor or a dict)")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)  # one file, not its characters
    odd = [p for p in paths if not isinstance(p, (str, os.PathLike))]  # (a None among them is one)
    if odd:
        raise BadType(f"diarize_files takes paths of audio files, got a {type(odd[0]).__name__} among them "
                      "(diarize() takes a waveform: an array, a tensor or a dict)")
    paths = [os.fspath(p) if isinstance(p, os.PathLike) and not isinstance(p, pathlib.Path) else p for p in paths]
    if not isinstance(out_dir, (str, os.PathLike)):  # (pathlib's TypeError otherwise)
        raise BadType(f"out_dir must be a folder's path, got {type(out_dir).__name__}")
    if plot:
        from ..plot import pyplot

        pyplot()  # without matplotlib: one error before any work
    stems = collections.Counter(recording_uri(p) for p in paths)
    clash = sorted(s for s, n in stems.items() if n > 1)
    if clash:  # the second would replace the first's output
        raise BadValue(f"{stems[clash[0]]} inputs named {clash[0]}.* would write the same "
                       f"{pathlib.Path(out_dir) / (clash[0] + FORMATS[format])}: rename one, or diarize them apart")
    out_dir = pathlib.Path(out_dir)
    blocked = next((d for d in (out_dir, *out_dir.parents) if d.exists() and not d.is_dir()), None)
    if blocked is not None:  # before any work: the outputs go into a folder
        raise BadValue(f"--out {out_dir}: {blocked} is a file, and the outputs go into a folder: give another --out")
    targets = [w for p in paths for w in outputs(p, out_dir, format, plot)]
    long = next((w for w in targets if len(written.name_bytes(w.name)) > written.NAME_MAX), None)
    if long is not None:  # (an input name of 252-255 bytes: found after its whole diarization, then thrown away)
        raise BadValue(f"{long.name[:40]}... would be {len(written.name_bytes(long.name))} bytes, more than a file "
                       f"name may be ({written.NAME_MAX}): rename the audio to a shorter name")
    taken = next((w for w in targets if w.is_dir()), None)
    if taken is not None:
        raise BadValue(f"{taken} is a folder where an output would go: move it away or give another --out")
    # the audio's folder as given and where a link to it leads
    # (written.resolved: a link that loops is taken as it is, and named by the file's own error)
    beside = {d for p in paths
              for d in (written.resolved(pathlib.Path(p).absolute().parent), written.resolved(p).parent)}
    kept = [w for w in map(written.resolved, targets) if w.exists() and w.parent in beside]  # (a loop: as it is)
    if kept:  # the user's own file beside the audio (a reference RTTM) would be replaced
        raise BadValue(f"{kept[0]} exists beside its audio and would be replaced: diarize into another folder "
                       "(--out), or move it away first")
    written.check(targets, overwrite=overwrite, hint="diarize into another folder (--out)")
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # the folders this call creates
    written.writable_folder(out_dir)  # a read-only folder: one line now, not an error per file after the work
    try:
        m, enc, cfg, counts, prov = _prepare(model, embedding, num_speakers, min_speakers, max_speakers, options)
        status = _write_each(paths, out_dir, m, enc, cfg, counts, prov, format, exclusive, plot, progress, on_result)
    finally:  # where nothing was written (every file bad, a bad option), the folders it made are not left behind
        for d in made:
            with contextlib.suppress(OSError):  # (not empty: something was written there)
                d.rmdir()
    return status


def _write_each(paths, out_dir, m, enc, cfg, counts, prov, format, exclusive, plot, progress, on_result) -> dict:
    """:func:`diarize_files`' loop: each file diarized and written, its status kept."""
    if plot:
        from ...provenance import png_metadata
        from ..plot import timeline_png
    status = {}
    settings = {**asdict(cfg), **counts}
    weights = _weights_digest(m, enc)  # what the modules hold, whatever file (or none) they came from
    for i, p in enumerate(paths):
        try:
            files = outputs(p, out_dir, format, plot)
            key = _made_key(p, settings, prov, weights, format, exclusive)
            result = _kept(files, recording_uri(p), key, format, settings, prov, exclusive)
            if result is None:
                result = _diarize(p, None, m, enc, cfg, None, counts, prov)
                result = result.exclusive() if exclusive else result
                note = None if key is None else {"key": key, "duration": result.duration}
                written.write_text(files[0], render(result, format), note)
                if plot:
                    made = png_metadata(Description=json.dumps({"settings": result.settings,
                                                                "pipeline": result.provenance}))
                    written.write_with(files[1], functools.partial(_draw, timeline_png, result, made), note)
                status[str(p)] = "ok"
            else:
                status[str(p)] = "kept"
        # AudioError and friends, said in one line per file; any other exception is a bug (a numpy ValueError
        # was said as the file's error, and evaluate scored it as all missed): its traceback stops the call,
        # and the files written before it are kept
        except UserError as e:
            status[str(p)] = str(e)
        except OSError as e:
            status[str(p)] = _refused(e, out_dir)
        if on_result and status[str(p)] in DONE:  # outside the try: the caller's own errors are not the file's
            on_result(str(p), result)
        if progress:  # file i is done (counted from 0, as every progress callback)
            progress(i, len(paths), pathlib.Path(p).name)
    return status


def _refused(e: OSError, out_dir) -> str:
    """A file's OSError as the line a user reads: the path it names (a rename names the output second, after the
    temporary written first) and the system's reason; one that names none (a full disk) names the folder."""
    name = e.filename2 or e.filename
    return f"{name if name is not None else out_dir}: {e.strerror or type(e).__name__}"


def _draw(timeline_png, result: Diarization, metadata: dict, path: pathlib.Path) -> None:
    timeline_png(result, path, duration=result.duration, metadata=metadata, uri=result.uri)


def _weights_digest(*modules) -> str:
    """SHA-256 of what the modules compute with: their state and the settings and maps a model carries beside it
    (its post-processing, its features, its whitening and PLDA model)."""
    from .segment_cache import hash_value, weights_digest

    h = hashlib.sha256()
    for m in modules:
        h.update(weights_digest(m).encode())
        for attr in ("postprocess", "features", "whitening"):
            hash_value(h, getattr(m, attr, None))
    return h.hexdigest()


def _made_key(audio, settings: dict, prov: dict, weights: str, format: str, exclusive: bool) -> str | None:
    """What an output is made from, as one digest: the audio's bytes, the settings and speaker counts, the
    provenance (normlab's version, the model and encoder files' SHA-256), the weights the modules hold, normlab's
    own source (a build of one version edited since), the format and ``exclusive``; None where the audio cannot
    be read (reading it for the diarization then says why, as for any other file)."""
    try:
        if not pathlib.Path(audio).is_file():  # a pipe (/dev/stdin) is read once: by the decoder, not here
            return None
        audio = written.digest(pathlib.Path(audio))
    except OSError:
        return None
    from ...provenance import code_digest

    what = {"audio": audio, "settings": settings, "provenance": prov, "weights": weights, "code": code_digest(),
            "format": format, "exclusive": exclusive}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _kept(files: list[pathlib.Path], uri: str, key: str | None, format: str, settings: dict, prov: dict,
          exclusive: bool) -> Diarization | None:
    """The result written before into ``files`` from the same inputs (``key``), every file unchanged since,
    read back; None where it must be made (anything missing, edited, or made from other inputs)."""
    notes = [written.made(f) for f in files] if key is not None else [None]
    if any(n is None or n.get("key") != key for n in notes):
        return None
    duration = notes[0].get("duration")
    if not (type(duration) in (int, float) and math.isfinite(duration) and duration >= 0):
        return None  # a note edited by hand: made again
    try:
        if format == "json":
            data = json.loads(files[0].read_text(encoding="utf-8"))
            turns = [Turn(t["uri"], t["start"], t["end"] - t["start"], t["speaker"]) for t in data["turns"]]
        else:
            turns = [t for ts in read_rttm(files[0]).values() for t in ts]
        return Diarization(turns, uri=uri, duration=duration, settings=settings,
                           provenance=prov, is_exclusive=exclusive)
    except (UserError, OSError, ValueError, KeyError, TypeError):  # unreadable after all: made again
        return None


def to_annotation(turns: list[Turn], uri: str | None = None):
    """A ``pyannote.core.Annotation`` of the turns (needs ``pip install normlab[annotation]``)."""
    try:
        from pyannote.core import Annotation, Segment
    except ImportError:
        raise MissingDependency("to_annotation needs pyannote.core: pip install 'normlab[annotation]'") from None
    own = getattr(turns, "uri", None)  # a Diarization names its recording, even without turns
    if isinstance(turns, dict):
        raise BadType("to_annotation takes one recording's list of turns, not a {uri: turns} table")
    if turns is None or isinstance(turns, (str, bytes)):  # (None: "'NoneType' object is not iterable")
        raise BadType(f"to_annotation takes one recording's list of turns, got {type(turns).__name__}")
    # (a generator is read once; a turn of negative or NaN length was dropped silently)
    turns = check_turns(list(turns), "to_annotation's turns")
    uri = uri or own or (turns[0].uri if turns else None)
    ann = Annotation(uri=uri)
    for i, t in enumerate(sorted(turns)):
        ann[Segment(t.start, t.end), i] = t.speaker
    return ann


def from_annotation(annotation, uri: str | None = None) -> list[Turn]:
    """Turns of a ``pyannote.core.Annotation``: the recording's name and the speaker labels as strings, each run
    of white space one ``_`` (as a file's name becomes its recording's), so that they write as RTTM fields."""
    if not hasattr(annotation, "itertracks"):  # (None: an AttributeError)
        raise BadType(f"from_annotation takes a pyannote.core.Annotation, got {type(annotation).__name__}")
    uri = as_field(uri or annotation.uri or "audio")
    turns, seen = [], {}
    for seg, _, label in annotation.itertracks(yield_label=True):
        speaker = as_field(str(label))
        if not speaker:
            raise BadValue(f"speaker label {label!r} at {seg.start:.3f} s has no characters an RTTM field can hold")
        if seen.setdefault(speaker, label) != label:  # ('spk A' and 'spk_A', 1 and '1': two speakers made one)
            raise BadValue(f"speaker labels {seen[speaker]!r} and {label!r} both become {speaker!r} as an RTTM "
                           "field: rename one")
        turns.append(Turn(uri, float(seg.start), float(seg.end - seg.start), speaker))
    return sorted(turns)


__all__ = ["DONE", "diarize", "diarize_files", "made_with", "load_model", "load_encoder", "every_encoder", "provenance",
           "to_annotation", "from_annotation", "Diarization"]
