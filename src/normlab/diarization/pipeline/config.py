"""``PipelineConfig``: the pipeline's settings, from its defaults, the model file, the mode and the caller's options."""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from dataclasses import dataclass

from ..._checks import BadValue, check_choice

#: post-processing a model file may set (its ``postprocess`` dict); anything else there is ignored
TUNABLE = ("threshold", "median", "window", "step", "cluster_threshold", "min_embed", "max_embed", "min_cluster",
           "min_cluster_share", "piece", "speakers", "vad", "vad_threshold", "veto_seconds", "weighting",
           "overlap_threshold", "merge_threshold", "whiten", "clustering", "vbx_fa", "vbx_fb", "vbx_dims", "flat_db",
           "flat_seconds", "fill_gap", "speaker_encoder", "reassign", "offset_threshold")

#: the speaker encoders the pipeline can embed with (``models/embed.py``, ``models/campplus.py``)
SPEAKER_ENCODERS = ("ge2e", "campplus")


#: each number's range: (name, lower test, upper test, what the message says it must be)
_pos = lambda v: v > 0  # noqa: E731
_any = lambda v: True  # noqa: E731
_RANGES = (
    ("window", _pos, lambda v: v <= 3600, "a number of seconds in (0, 3600]"),
    ("step", _pos, _any, "a number of seconds > 0"),
    ("threshold", lambda v: v >= 0, lambda v: v < 1, "in [0, 1)"),
    ("overlap_threshold", lambda v: v >= 0, lambda v: v < 1, "in [0, 1) (or None: the threshold)"),
    ("offset_threshold", lambda v: v >= 0, lambda v: v <= 1, "in [0, 1] (1: off)"),
    ("vad_threshold", lambda v: v >= 0, lambda v: v < 1, "in [0, 1)"),
    ("fill_gap", lambda v: v >= 0, lambda v: v <= 3600, "0 to 3600 seconds"),
    ("cluster_threshold", lambda v: v >= 0, lambda v: v <= 2, "a cosine distance in [0, 2]"),
    ("merge_threshold", lambda v: v >= 0, lambda v: v <= 2, "a cosine distance in [0, 2] (0: no merge)"),
    ("min_embed", _pos, lambda v: v <= 3600, "a number of seconds in (0, 3600]"),
    ("max_embed", _pos, lambda v: v <= 3600, "a number of seconds in (0, 3600]"),
    ("min_cluster", lambda v: v >= 0, _any, "a number of seconds >= 0"),
    ("min_cluster_share", lambda v: v >= 0, lambda v: v < 1, "a share of the recording's speech in [0, 1)"),
    ("piece", _pos, lambda v: v <= 3600, "a number of seconds in (0, 3600]"),
    ("silence_db", _any, lambda v: v <= 0, "a level in dBFS <= 0"),
    ("silence_range_db", _pos, _any, "a number of dB > 0 (or None: silence_db alone)"),
    ("flat_db", lambda v: v >= 0, lambda v: v <= 100, "in [0, 100] dB"),
    ("flat_seconds", _pos, lambda v: v <= 60, "in (0, 60] seconds"),
    ("veto_seconds", _pos, lambda v: v <= 3600, "a number of seconds in (0, 3600]"),
    ("vbx_fa", _pos, _any, "a number > 0"),
    ("vbx_fb", _pos, _any, "a number > 0"),
)


#: each speaker encoder's and speakers mode's defaults for a model file that holds no settings chosen for them
#: (docs/diarization.md). A cut is a cosine distance in one encoder's space, so each encoder has its own (the
#: shipped model's dev set chose 0.6 with CAM++ in eend mode). GE2E's were tuned on its
#: development data: speech at 0.5 in 1.5 s pieces judged by their embeddings, on real speech and the
#: natural-voice dev conversations; the model's local speakers over a whole window (and the model file's
#: threshold), on the dev conversations. CAM++'s are those an earlier shipped model's dev set chose for it in
#: each mode (its pieces, cut and small-cluster floor); the shipped file stores its own choice, which wins
MODE_DEFAULTS = {
    "ge2e": {"speech": {"threshold": 0.5, "piece": 1.5, "cluster_threshold": 0.3, "min_cluster": 3.0},
             "eend": {"piece": 10.0, "cluster_threshold": 0.25, "min_cluster": 2.0}},
    "campplus": {"speech": {"threshold": 0.5, "piece": 3.0, "cluster_threshold": 0.55, "min_cluster": 4.0},
                 "eend": {"piece": 3.0, "cluster_threshold": 0.6, "min_cluster": 4.0}},
}


@dataclass(frozen=True)
class PipelineConfig:
    window: float = 10.0  # seconds per local segmentation window (a few turns, few local speakers)
    step: float = 5.0  # seconds between window starts: each frame is seen by ~window/step windows
    threshold: float = 0.5  # speaker activity threshold on the aggregated probabilities (the model file's)
    overlap_threshold: float | None = None  # eend mode: a window's second (third...) speaker counts above this
    #                                         (None: threshold); higher than threshold, overlap is called less
    median: int = 11  # median filter width, frames (the model file's)
    offset_threshold: float = 0.15  # then a speaker's turn holds on through frames where nobody talks while its
    #                                 probability stays above this (hysteresis, postprocess.hold; 1: off)
    fill_gap: float = 0.0  # seconds: a speaker's pauses shorter than this are filled (0: none; per mode)
    cluster_threshold: float = 0.3  # cosine distance where the tree is cut (per mode: MODE_DEFAULTS)
    min_embed: float = 0.5  # seconds of a local speaker's speech needed for its embedding
    max_embed: float = 3.0  # seconds of it used at most (two 1.6 s partials)
    min_cluster: float = 3.0  # seconds: clusters with less speech fold into the nearest larger one (per mode)...
    min_cluster_share: float = 0.04  # ...or with less than this share of the recording's speech, where that is
    #                                  more (long recordings: a voice's stray pieces add up past any fixed floor)
    merge_threshold: float = 0.0  # then clusters whose centroids are closer than this cosine distance merge (0: no)
    reassign: bool = True  # last, each piece moves to the cluster of its nearest centroid (cluster.nearest_centroid)
    piece: float = 1.5  # seconds: a local speaker gets one embedding per piece of its window (per mode)
    speakers: str = "speech"  # "speech": the model's speech (any local speaker), cut into pieces, each piece's
    #                           speaker from its embedding; "eend": the model's local speakers (overlap kept)
    silence_db: float = -70.0  # frames quieter than this (dBFS) are never speech, whatever the model says...
    silence_range_db: float | None = 45.0  # ...or, in a quieter recording, more than this below its loud frames
    #                                        (segment.silence_gate_db; None: silence_db alone)
    flat_db: float = 2.0  # frames whose level above 300 Hz varies less than this (dB, 90th - 10th percentile) over
    #                       the flat_seconds around them are never speech: steady noise or hum (segment.flat_frames;
    #                       segment.band_level_db; 0: off)
    flat_seconds: float = 2.0
    vad: str = "gate"  # "gate": frames Silero VAD calls non-speech are silence whatever the model says;
    #                    "speech": the VAD's probability is the speech activity (speakers="speech");
    #                    "union": speech where the model or the VAD hears it (segment.vad_union);
    #                    "veto": silence only where the VAD hears no speech for veto_seconds or more; "off"
    vad_threshold: float = 0.5  # speech probability above which a frame is speech for the VAD
    veto_seconds: float = 3.0  # vad "veto": the shortest run of the VAD's non-speech that silences the model
    whiten: bool = False  # cluster the embeddings mapped by the model file's whitening (pipeline/whiten.py)
    clustering: str = "ahc"  # "ahc": the tree cut at cluster_threshold decides the speakers; "vbx": the tree cut
    #                          there starts VBx's variational Bayes under the model file's PLDA model (pipeline/vbx.py)
    vbx_fa: float = 0.2  # vbx: the scale of the pieces' log-likelihoods
    vbx_fb: float = 1.0  # vbx: the scale of the speakers' prior (larger: fewer speakers)
    vbx_dims: int = 64  # vbx: PLDA dimensions used, the most between-speaker variance first
    speaker_encoder: str = "ge2e"  # "ge2e": GE2E (Resemblyzer's weights); "campplus": CAM++ (3D-Speaker's weights)
    weighting: str = "mean"  # how the windows covering a frame are averaged: "hamming" trusts a window's
    #                             middle more than its edges (pyannote's aggregation); "mean" weighs them alike
    batch: int = 16  # windows per model call

    def __post_init__(self):
        """Each setting on its own: one ``BadValue`` line for the first that cannot work (the combinations, and
        what the model file must hold for them, are checked by :meth:`for_model`)."""
        for name in ("whiten", "reassign"):
            if not isinstance(getattr(self, name), bool):
                raise BadValue(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("batch", "median", "vbx_dims"):  # numpy's whole numbers as Python's; True is no number
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
        if not (type(self.batch) is int and self.batch >= 1):
            raise BadValue(f"batch must be a whole number >= 1, got {self.batch!r}")
        if not (type(self.median) is int and 1 <= self.median <= 1001 and self.median % 2 == 1):
            raise BadValue(f"median must be an odd number of frames from 1 to 1001, got {self.median!r}")
        if not (type(self.vbx_dims) is int and self.vbx_dims >= 1):
            raise BadValue(f"vbx_dims must be a whole number >= 1, got {self.vbx_dims!r}")
        for name, lo, hi, what in _RANGES:
            value = getattr(self, name)
            if value is None and name in ("overlap_threshold", "silence_range_db"):
                continue
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            if not (ok and lo(value) and hi(value)):
                raise BadValue(f"{name} must be {what}, got {value!r}")
        if not self.step <= self.window:
            raise BadValue(f"need 0 < step <= window, got window={self.window}, step={self.step}")
        # a window is cut into round(window / piece) equal pieces (segment.speaker_pieces): shorter than min_embed,
        # none could hold enough speech for an embedding, and the result was empty without a word
        cut = self.window / max(1, round(self.window / self.piece))
        if cut < self.min_embed:
            raise BadValue(f"piece {self.piece:g} s cuts the {self.window:g} s window into pieces of {cut:.3g} s, "
                           f"shorter than min_embed ({self.min_embed:g} s, the least speech a piece is embedded "
                           "from): no piece would be embedded")
        check_choice(self.speakers, ("eend", "speech"), "speakers mode")
        check_choice(self.vad, ("off", "gate", "speech", "union", "veto"), "vad mode")
        check_choice(self.weighting, ("hamming", "mean"), "window weighting")
        check_choice(self.clustering, ("ahc", "vbx"), "clustering")
        check_choice(self.speaker_encoder, SPEAKER_ENCODERS, "speaker encoder")

    @classmethod
    def for_model(cls, model, **overrides) -> "PipelineConfig":
        """The pipeline's defaults, the model file's ``postprocess``, the mode's, then ``overrides`` (None ignored).

        ``vad="speech"`` without ``speakers`` means ``speakers="speech"`` (the VAD's
        speech, each piece's speaker from its embedding), at the settings the
        file stores for that reading (``postprocess["vad_speech"]``) where it
        has them; with ``speakers="eend"`` it is an error. A model file carries two kinds of settings: the
        window-level ones its recipe chose for its own local speakers
        (threshold, median), and, under
        ``postprocess["modes"][mode]``, the whole pipeline's settings chosen on
        a development set for each mode (``normlab diarize tune
        --save``). The latter win over everything but ``overrides``. Without
        them, the defaults of the speaker encoder that embeds come in
        (``MODE_DEFAULTS[encoder][mode]``): in ``eend`` mode the file's
        settings win over them, while ``speech`` mode (which reads the model
        differently: any speaker, gated) keeps its own.
        """
        post = getattr(model, "postprocess", {})
        stored = {k: v for k, v in post.items() if k in TUNABLE}
        given = {k: v for k, v in overrides.items() if v is not None}
        # vad="speech" (Silero alone decides speech) is a speech-mode reading: asked for alone, it brings that mode
        mode = given.get("speakers", "speech" if given.get("vad") == "speech" else stored.get("speakers", cls.speakers))
        tuned = {k: v for k, v in post.get("modes", {}).get(mode, {}).items() if k in TUNABLE}
        if given.get("vad") == "speech" and tuned.get("vad") != "speech":
            # Silero alone deciding speech: the settings the dev set chose for that reading (the comparison the
            # model file's results state), not the mode's settings chosen with the model deciding speech
            alt = post.get("vad_speech")
            if alt is not None and alt.get("speakers", mode) == mode:
                tuned = {k: v for k, v in alt.items() if k in TUNABLE}
        if given.get("whiten") and not tuned.get("whiten") and getattr(model, "whitening", None) is not None:
            # whitened embeddings need their own cluster cut: the settings chosen with them on the dev set
            alt = post.get("whitened", {}).get(mode)
            if alt is None and "cluster_threshold" not in given:  # (a caller giving the cut chose it)
                raise BadValue(f"whiten: this model file has no {mode}-mode settings chosen with its whitening (the "
                               "cluster cut differs): choose them with normlab diarize tune --save")
            tuned = {k: v for k, v in (alt or tuned).items() if k in TUNABLE}
        how = given.get("clustering")
        if how and how != tuned.get("clustering", cls.clustering):
            # VBx starts from a lower cut than the tree alone is cut at: the settings chosen on dev for the other
            alt = post.get(how, {}).get(mode)
            has_plda = (getattr(model, "whitening", None) or {}).get("plda") is not None  # (else: the error below)
            if alt is None and how == "vbx" and has_plda and "cluster_threshold" not in given:  # (the caller's cut)
                raise BadValue(f"clustering 'vbx': this model file has no {mode}-mode settings chosen for VBx (its "
                               "starting cut differs): choose them with normlab diarize tune --save")
            tuned = {k: v for k, v in (alt or tuned).items() if k in TUNABLE}
        enc = given.get("speaker_encoder")
        if enc is not None:  # named as an unknown encoder before any settings are looked up for it
            check_choice(enc, SPEAKER_ENCODERS, "speaker encoder")
        if enc and enc != tuned.get("speaker_encoder", cls.speaker_encoder):
            # another encoder's embeddings need their own cut (and piece): the settings chosen with it on dev
            alt = post.get("encoders", {}).get(enc, {}).get(mode)
            if alt is None and "cluster_threshold" not in given and post.get("modes"):  # (the caller's cut)
                raise BadValue(f"speaker_encoder {enc!r}: this model file has no {mode}-mode settings chosen with "
                               "it (the cluster cut differs): choose them with normlab diarize tune --save")
            tuned = {k: v for k, v in (alt or tuned).items() if k in TUNABLE}
        # the defaults of the encoder that will embed (the caller's, else the settings', else the class's)
        encoder = given.get("speaker_encoder", tuned.get("speaker_encoder",
                                                         stored.get("speaker_encoder", cls.speaker_encoder)))
        mode_kw = MODE_DEFAULTS.get(encoder, {}).get(mode, {})
        kw = {**stored, **mode_kw} if mode == "speech" else {**mode_kw, **stored}
        kw = {**kw, **tuned, **given, "speakers": mode}
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kw) - set(names))
        if unknown:
            raise BadValue("unknown pipeline option" + ("s " if len(unknown) > 1 else " ")
                           + ", ".join(_with_hint(k, names) for k in unknown))
        cfg = cls(**kw)
        if cfg.whiten and getattr(model, "whitening", None) is None:  # first: none to speak of below
            raise BadValue("whiten is on but the model file holds no embedding whitening (fit one: normlab diarize "
                           "whiten MODEL --train DIR)")
        if cfg.speaker_encoder != "ge2e" and (cfg.whiten or cfg.clustering == "vbx"):
            raise BadValue(f"the model file's whitening and PLDA model were fitted on GE2E embeddings: "
                           f"{'whiten' if cfg.whiten else 'clustering vbx'} needs speaker_encoder 'ge2e', not "
                           f"{cfg.speaker_encoder!r}")
        if cfg.clustering == "vbx":
            if (getattr(model, "whitening", None) or {}).get("plda") is None:
                raise BadValue("clustering 'vbx' needs the model file's PLDA model (fit one: normlab diarize whiten "
                               "MODEL --train DIR)")
            if cfg.whiten:
                raise BadValue("clustering 'vbx' has its own model of the embeddings: whiten applies to 'ahc' only")
        if cfg.speakers == "eend" and cfg.vad == "speech":
            raise BadValue("vad 'speech' (Silero alone decides speech) reads the model in speakers mode 'speech'; "
                           "with speakers 'eend' use vad 'gate'")
        return cfg


#: the command line's spellings whose Python keyword differs (``--local-speakers`` sets ``speakers``)
_CLI_NAMES = {"local_speakers": "speakers"}


def _with_hint(name: str, names: list[str]) -> str:
    """``'name'``, with the closest known option where there is one: ``'speakrs' (did you mean 'speakers'?)``."""
    close = [_CLI_NAMES[name]] if name in _CLI_NAMES else difflib.get_close_matches(name, names, n=1)
    return f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
