"""One command from nothing to a scored model: simulate, train, tune on dev, score on test.

``normlab diarize recipe --out DIR`` runs it; with the defaults it produces
the 4-local-speaker model shipped in the package (``assets/eend_local4.pt``;
``make model``). Every stage is
cached or checkpointed under ``DIR``, so a killed run resumes where it
stopped. The model is a local segmentation model: trained on 10 s windows
of 1-4 speaker conversations with 4 outputs (PIT: outputs beyond the
speakers present learn silence), scored per window (``metrics/windows.py``). The
threshold and median width are chosen on the dev split (voices disjoint from
train and test) and each test split is scored once, with them. The model file
records the recipe, the training voices with their packages and licences,
and the software versions (``provenance.py``).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..._checks import BadValue
from ..data.dataset import MixtureSet
from ..data.simulate import SimConfig, simulate
from ..metrics.evaluate import evaluate, tune
from ..metrics.windows import speaker_counts, window_probs
from ..models.eend import EENDModel, ModelConfig
from . import provenance
from .train import MAX_LR, TrainConfig, data_digest, read_checkpoint, train

Progress = Callable[[int, int, str], None]
LAST_STAGE = ("train_stretch", "train_nonspeech")  # with finetune_steps, these join in the last stage
REVERB_RT60 = (0.2, 0.6)  # seconds; the reverberant sets use seed + 1: other conversations than the dry ones


@dataclass(frozen=True)
class RecipeConfig:
    n_train: int = 400  # simulated training conversations, 1-4 speakers: real people and synthesizers, perturbed
    n_train_real: int = 1000  # more training conversations of real people only (prompts.py), perturbed
    n_dev: int = 40  # for the threshold and median width: conversations of the dev split's real people
    n_dev_mixed: int = 40  # for the pipeline's settings: dev people and dev synthesizer voices, 1-4 speakers
    n_dev_synth: int = 40  # for the pipeline's settings: EEND-style mixtures of dev synthesizer voices (overlap)
    n_test_mixed: int = 40  # scored once: test people and test synthesizer voices, 1-4 speakers
    n_test: int = 40  # scored once: conversations of the test split's real people, perturbed like train
    n_test_dry: int = 0  # scored once (test voices), no perturbation: white noise at 10-20 dB only
    n_train_synth: int = 300  # EEND-style mixtures of synthesizer voices (the previous recipe's training set)
    synth_from: int = 2400  # ... which join the training data at this step (a second stage: the model keeps
    #                         what it knew of synthetic voices while real people stay most of what it hears)
    n_test_synth: int = 40  # scored once: EEND-style mixtures of the test split's synthesizer voices, 1-4 speakers
    n_train_stretch: int = 0  # training conversations with a 3-12 s pause filled with a sound (nonspeech.py)
    n_train_nonspeech: int = 0  # training recordings of sounds alone, nobody speaking (nonspeech.py)
    n_dev_stretch: int = 0  # for the pipeline's settings: dev conversations with a 3-12 s pause filled with a sound
    n_test_stretch: int = 0  # scored once: test conversations with such a pause
    finetune_steps: int = 0  # > 0: a last stage from the trained model, every training set with the two above
    finetune_lr: float = 3e-4  # ... its peak learning rate (a fresh Adam, cosine to 5%)
    n_flite: int = 0  # scored once, flite's voices (the older held-out set; flite voices are now in train)
    n_train_reverb: int = 0  # extra training mixtures, every one in a room (RT60 in REVERB_RT60)
    n_test_reverb: int = 0  # scored once, test voices, every one in a room
    n_speakers: int = 4  # most speakers in a mixture and in a window: the model's outputs
    min_speakers: int = 1  # mixtures cycle through min_speakers..n_speakers speakers
    beta: float = 2.0  # mean silence before an utterance for 1-2 speakers (more speakers: EEND-EDA's scale)
    min_utterances: int = 4
    max_utterances: int = 10
    sources: str = "mixed"  # voices.SOURCES: "mixed": real people, espeak-ng, flite and festival; "neural": real
    #                         people and neural voices (dev and test: real people, as with "mixed"); "all": no real
    style: str = "conversation"  # "conversation": turn-taking (conversation.py); "mixture": EEND's timelines
    real_p: float = 0.7  # in "mixed" conversations, share of speakers who are real people
    augment: int = 1  # 1: speaker warps and levels, rooms, noise types, telephone, gain (augment.Perturbation)
    steps: int = 6400
    lr: float = 1e-3
    warmup: int = 200
    decay: str = "cosine"
    restart_at: int = 3200  # a second cosine cycle from here to ``steps`` (peak restart_lr; a run of at most
    restart_lr: float = 3e-4  # restart_at steps has one cycle): a longer run keeps the first cycle's low-lr end
    batch: int = 32
    frames: int = 100  # 100 ms frames per training window: the window the model is made for (10 s)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    norm: str = "layernorm"
    placement: str = "pre"
    encoder: str = "transformer"  # or "conformer"
    head: str = "multilabel"  # or "powerset" (models/powerset.py)
    dropout: float = 0.0  # none: it costs ~13% of a CPU step, and 13 h of varied audio over a few thousand steps
    #                       does not overfit (train and dev losses stay together)
    seed: int = 0
    dev_extra: str = ""  # more dev folders (comma-separated; e.g. real recordings) for the pipeline's settings
    whiten_lam: float = 1.0  # > 0: fit the speaker embeddings' whitening (pipeline/whiten.py) with this shrinkage
    whiten_per_folder: int = 600  # ... on the first conversations of train and train_real; stored in the model file
    tune_grid: str = ""  # NAME=V1,V2 items (';'-separated) narrowing pipeline/tuning.py's grid; "none": no tuning

    def check(self) -> None:
        """One ``BadValue`` line for the first setting that could not work, before any simulation or training (a
        later stage would otherwise fail on it hours in)."""
        import math

        from ..._checks import BadValue, NotFound
        from ..data.simulate import persons_for
        from ..data.voices import voices
        from ..pipeline.tuning import SEGMENT_GRID, STITCH_GRID, parse_grid

        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise BadValue(f"{name} must be {what}, got {getattr(self, name)!r}")

        for f in self.__dataclass_fields__:
            v = getattr(self, f)
            if f.startswith("n_") and f not in ("n_speakers", "n_layers", "n_heads") or f in (
                    "synth_from", "finetune_steps", "warmup", "restart_at", "whiten_per_folder", "seed"):
                need(isinstance(v, int) and v >= 0, f, "a whole number >= 0")
        for f in ("n_dev", "n_test", "steps", "batch", "frames", "d_model", "n_layers", "n_heads", "n_speakers",
                  "min_speakers"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f, "a whole number >= 1")
        need(self.seed < 2**63, "seed", "below 2**63")
        need(self.min_speakers <= self.n_speakers, "min_speakers", f"at most n_speakers ({self.n_speakers})")
        splits = _splits(self)  # every simulation's own checks (beta, utterances per speaker, ...)
        # the first stage trains on something: n_train 0 with n_train_real under sources that make no train_real
        # set passed, and the training found an empty folder after the simulation
        need(any(sim.n_mixtures for name, sim in splits if name.startswith("train") and name != "train_synth"
                 and not (self.finetune_steps and name in LAST_STAGE)), "n_train",
             f"at least 1 where no other set trains the first stage (n_train_real does with sources real, mixed "
             f"or neural; sources is {self.sources!r})")
        for f in ("lr", "restart_lr", "finetune_lr"):
            need(isinstance(getattr(self, f), (int, float)) and 0 < getattr(self, f) <= MAX_LR, f,
                 f"a number in (0, {MAX_LR:g}]")
        need(0 <= self.real_p <= 1, "real_p", "in [0, 1]")
        need(0 <= self.dropout < 1, "dropout", "in [0, 1)")
        need(math.isfinite(self.whiten_lam) and self.whiten_lam >= 0, "whiten_lam", "a finite number >= 0")
        model, _ = self.model_config(), self.train_config()  # the model and its training, checked as built
        from .train import check_batch_fits, check_model_fits

        check_model_fits(model)
        check_batch_fits(self.batch, self.frames, model.input_dim, model.n_heads)
        if self.tune_grid != "none":
            parse_grid([g for g in self.tune_grid.split(";") if g.strip()], (SEGMENT_GRID, STITCH_GRID))
        for d in (d for d in self.dev_extra.split(",") if d):
            if not (pathlib.Path(d) / "ref.rttm").exists() and not any(pathlib.Path(d).glob("*.rttm")):
                raise NotFound(f"dev_extra: {d} holds no reference RTTM")
        for name, sim in splits:  # last (it needs the synthesizers): enough persons for each set's speakers, which
            if sim.style != "nonspeech":  # simulate checks hours in, after the training
                try:
                    persons_for(voices(sim.split, sim.sources), sim.n_speakers)
                except BadValue as e:
                    raise BadValue(f"the {name} set: {e} (n_speakers {self.n_speakers}, sources "
                                   f"{self.sources!r})") from None

    def model_config(self) -> ModelConfig:
        return ModelConfig(d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
                           d_ff=4 * self.d_model, n_speakers=self.n_speakers, norm=self.norm,
                           placement=self.placement, encoder=self.encoder, dropout=self.dropout,
                           head=self.head)

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, lr=self.lr, warmup=self.warmup, decay=self.decay,
                           restart_at=self.restart_at if self.restart_at < self.steps else 0,
                           restart_lr=self.restart_lr,
                           ckpt_every=max(1, min(100, self.steps // 10)), seed=self.seed)


def _splits(cfg: RecipeConfig) -> list[tuple[str, SimConfig]]:
    """(folder name, simulation) of every set the recipe uses; train first."""
    def sim(split: str, n: int, rt60=None, seed: int = cfg.seed, augment: bool = bool(cfg.augment),
            sources: str = cfg.sources, style: str = cfg.style, speakers: int = cfg.n_speakers,
            stretch_p: float = 0.0) -> SimConfig:
        return SimConfig(n_mixtures=n, n_speakers=speakers, beta=cfg.beta, split=split, seed=seed, rt60=rt60,
                         min_speakers=min(cfg.min_speakers, speakers), min_utterances=cfg.min_utterances,
                         max_utterances=cfg.max_utterances, sources=sources if split != "flite" else "espeak",
                         augment=augment, beta_by_count=True, style=style, real_p=cfg.real_p, stretch_p=stretch_p)

    real = cfg.sources in ("real", "mixed", "neural")
    # dev and test hold two real people each (prompts.SPLIT_PERSONS): their conversations have 1-2 speakers
    held = {"sources": "real", "speakers": min(2, cfg.n_speakers)} if real else {}
    # the held-out sets of more speakers are the same whatever the training voices: with "real" or "neural"
    # sources a split's pool holds 2-3 persons, fewer than the 4 speakers of these sets
    wide = {"sources": "mixed"} if cfg.sources in ("real", "neural") else {}
    sets = [("train", sim("train", cfg.n_train))] if cfg.n_train else []  # (none: another set trains)
    if cfg.n_train_synth:
        sets.append(("train_synth", sim("train", cfg.n_train_synth, sources="all", style="mixture")))
    if real and cfg.n_train_real:
        sets.append(("train_real", sim("train", cfg.n_train_real, sources="real", seed=cfg.seed + 2)))
    if cfg.n_train_stretch:
        sets.append(("train_stretch", sim("train", cfg.n_train_stretch, seed=cfg.seed + 4, style="conversation",
                                          stretch_p=1.0)))
    if cfg.n_train_nonspeech:
        sets.append(("train_nonspeech", sim("train", cfg.n_train_nonspeech, style="nonspeech", augment=False)))
    sets += [("dev", sim("dev", cfg.n_dev, **held)), ("test", sim("test", cfg.n_test, **held))]
    if cfg.n_dev_mixed:  # more speakers than two real people give: their pseudo-speakers and synthesizer voices
        sets.append(("dev_mixed", sim("dev", cfg.n_dev_mixed, seed=cfg.seed + 3, **wide)))
    if cfg.n_dev_synth:
        sets.append(("dev_synth", sim("dev", cfg.n_dev_synth, sources="all", style="mixture")))
    if cfg.n_dev_stretch:
        sets.append(("dev_stretch", sim("dev", cfg.n_dev_stretch, seed=cfg.seed + 11, style="conversation",
                                        stretch_p=1.0)))
    if cfg.n_test_stretch:
        sets.append(("test_stretch", sim("test", cfg.n_test_stretch, seed=cfg.seed + 11, style="conversation",
                                         stretch_p=1.0)))
    if cfg.n_test_mixed:
        sets.append(("test_mixed", sim("test", cfg.n_test_mixed, seed=cfg.seed + 3, **wide)))
    if cfg.n_test_synth:
        sets.append(("test_synth", sim("test", cfg.n_test_synth, sources="all", style="mixture")))
    if cfg.n_test_dry:
        sets.append(("test_dry", sim("test", cfg.n_test_dry, seed=cfg.seed + 1, augment=False, **wide)))
    if cfg.n_train_reverb:
        sets.append(("train_reverb", sim("train", cfg.n_train_reverb, REVERB_RT60, cfg.seed + 1, False)))
    if cfg.n_test_reverb:
        sets.append(("test_reverb", sim("test", cfg.n_test_reverb, REVERB_RT60, cfg.seed + 1, False, **wide)))
    if cfg.n_flite and shutil.which("flite"):
        sets.append(("flite", sim("flite", cfg.n_flite, augment=False)))
    return sets


def _train_sets(cfg: RecipeConfig) -> list[tuple[str, SimConfig]]:
    """The recipe's training sets (``train``, ``train_synth``, ``train_real``, the sounds and the rooms), in
    ``_splits`` order."""
    return [(name, sim) for name, sim in _splits(cfg) if name.startswith("train")]


def train_recordings(cfg: RecipeConfig) -> int:
    """How many recordings the recipe trains on: every training set's."""
    return sum(sim.n_mixtures for _, sim in _train_sets(cfg))


def _train_names(cfg: RecipeConfig) -> list[str]:
    """The recipe's training folders, in ``_splits`` order."""
    return [name for name, _ in _train_sets(cfg)]


def simulate_splits(data: str | pathlib.Path, cfg: RecipeConfig, progress: Progress | None = None,
                    jobs: int = 1, which: str = "all") -> pathlib.Path:
    """``data/{train,dev,test,...}`` for ``cfg`` with ``jobs`` processes (existing mixtures are reused);
    ``which``: "all", "train" (the training sets) or "eval" (the others)."""
    data = pathlib.Path(data)
    for name, sim in _splits(cfg):
        if which == "all" or (which == "train") == name.startswith("train"):
            try:
                simulate(data / name, sim, progress=(lambda i, n, uri, s=name: progress(i, n, f"simulate {s} {uri}"))
                         if progress else None, jobs=jobs)
            except BadValue as e:  # simulate's advice names its own --out: here the folder follows --out or --data
                raise BadValue(f"{e} (the recipe simulates into {data}: give another --out or --data)") from None
    return data


def _resume_settings(cfg: RecipeConfig, tc: TrainConfig, folders: list[pathlib.Path], first: bool = False) -> dict:
    """What a stage's checkpoint must have been trained with for a rerun to resume it (as ``diarize train``
    checks): the model, the schedule but its length, the batches and the data; more steps may follow. ``first``:
    the first stage, whose restart is compared as set, not as a run's length uses it: a run of ``restart_at``
    steps has one cycle, and a longer one extends it with the second (a shorter first run's cosine, as any
    cosine extended, continues from where it stopped on the longer schedule)."""
    schedule = {k: v for k, v in asdict(tc).items() if k not in ("steps", "ckpt_every")}
    if first:
        schedule["restart_at"] = cfg.restart_at
    return {"model": asdict(cfg.model_config()), "schedule": schedule, "batch": cfg.batch, "frames": cfg.frames,
            "synth_from": cfg.synth_from, "data": [f.name for f in folders], "data_digest": data_digest(folders)}


def train_model(data: pathlib.Path, out: pathlib.Path, cfg: RecipeConfig,
                progress: Progress | None = None) -> tuple[EENDModel, list[float]]:
    """Train on the ``data/train*`` sets with checkpoints in ``out/ckpt`` (resumes); ``train_synth`` joins at
    step ``cfg.synth_from``; with ``cfg.finetune_steps``, the sounds-without-speech sets wait for that stage."""
    names = _train_names(cfg)
    if cfg.finetune_steps:
        names = [n for n in names if n not in LAST_STAGE]
    first = MixtureSet([data / n for n in names if n != "train_synth"], n_speakers=cfg.n_speakers)
    torch.manual_seed(cfg.seed)
    model = EENDModel(cfg.model_config())
    model.features = first.cfg
    draw = first.batches(cfg.batch, cfg.frames)
    if "train_synth" in names and cfg.synth_from < cfg.steps:
        every = first.joined(MixtureSet(data / "train_synth", n_speakers=cfg.n_speakers)).batches(cfg.batch, cfg.frames)
        last = out / "ckpt" / "last.pt"
        done = [read_checkpoint(last)["step"] if last.exists() else 0]  # steps drawn so far

        def staged(gen: torch.Generator):
            done[0] += 1
            return (draw if done[0] <= cfg.synth_from else every)(gen)
    else:
        staged = draw
    tc = cfg.train_config()
    losses = train(model, staged, tc, out / "ckpt",
                   (lambda s, n, loss: progress(s - 1, n, f"train loss {loss:.4f}")) if progress else None,
                   config=_resume_settings(cfg, tc, [data / n for n in names], first=True))
    _stop_if_diverged(out / "ckpt" / "last.pt", losses)
    return model.eval(), losses


class TrainingDiverged(BadValue):
    """A training stage that diverged: one line for the recipe's user; ``step``, ``loss`` and the finite steps'
    ``losses`` for a caller to whom a diverged run is a result (the report's diarization study: DER = inf)."""

    def __init__(self, message: str, step: int, loss: float, losses: list[float]):
        super().__init__(message)
        self.step, self.loss, self.losses = step, loss, losses

    def __reduce__(self):  # (raised in a worker process, it is rebuilt in the caller's)
        return type(self), (str(self), self.step, self.loss, self.losses)


def _stop_if_diverged(last: pathlib.Path, losses: list[float] | None = None) -> None:
    """A stage whose training diverged ends the recipe with one line: its checkpoint keeps the last finite
    weights and says where (a rerun reports it again); nothing is tuned or scored on them."""
    d = read_checkpoint(last).get("diverged")
    if d:
        raise TrainingDiverged(f"training diverged at step {d['step']} (loss {d['loss']:.4g}, gradient norm "
                               f"{d['grad_norm']:.4g}); {last} keeps the weights of step {d['step'] - 1}: run the "
                               "recipe again with a lower learning rate into another --out", d["step"], d["loss"],
                               list(losses or []))


def finetune_model(data: pathlib.Path, out: pathlib.Path, cfg: RecipeConfig, model: EENDModel,
                   progress: Progress | None = None) -> tuple[EENDModel, list[float]]:
    """The last stage: ``cfg.finetune_steps`` more steps from ``model`` on every ``data/train*`` set (the
    sounds-without-speech sets among them), a fresh Adam and one cosine cycle from ``cfg.finetune_lr``;
    checkpoints in ``out/ckpt_finetune`` (resumes)."""
    names = _train_names(cfg)
    every = MixtureSet([data / n for n in names], n_speakers=cfg.n_speakers)
    tc = TrainConfig(steps=cfg.finetune_steps, lr=cfg.finetune_lr, warmup=max(1, cfg.warmup // 4), decay="cosine",
                     ckpt_every=max(1, min(100, cfg.finetune_steps // 10)), seed=cfg.seed + 5)
    model.train()
    # the stage starts from the trained model: a longer first stage is another start
    start = {"first_stage": _resume_settings(cfg, cfg.train_config(), [data / n for n in names], first=True),
             "steps": cfg.steps}
    losses = train(model, every.batches(cfg.batch, cfg.frames), tc, out / "ckpt_finetune",
                   (lambda s, n, loss: progress(s - 1, n, f"finetune loss {loss:.4f}")) if progress else None,
                   config={**_resume_settings(cfg, tc, [data / n for n in names]), "start": start})
    _stop_if_diverged(out / "ckpt_finetune" / "last.pt", losses)
    return model.eval(), losses


def _der(probs: dict, ref: dict, post: dict) -> dict:
    out = {}
    for collar in (0.25, 0.0):
        r = evaluate(probs, ref, collar=collar, **post)
        out[f"collar_{collar:g}"] = {"der": r.der, "false_alarm": r.false_alarm / r.total,
                                     "missed": r.missed / r.total, "confusion": r.confusion / r.total}
    return out


def score_model(model: EENDModel, data: pathlib.Path, frames: int = 100) -> dict:
    """Local (per-window, ``metrics/windows.py``) DER: post-processing tuned on ``data/dev`` (sets
    ``model.postprocess``), then each test set scored once with it."""
    dev_probs, dev_ref = window_probs(model, data / "dev", frames)
    best, grid = tune(dev_probs, dev_ref, collar=0.25, medians=(1, 5, 11))
    model.postprocess.update(best)
    result = {"postprocess": best, "dev_grid": grid, "dev_der": min(g["der"] for g in grid),
              "window_frames": frames}
    for name in ("test", "test_mixed", "test_synth", "test_stretch", "test_dry", "test_reverb", "flite"):  # once each
        if (data / name / "ref.rttm").exists():
            probs, ref = window_probs(model, data / name, frames)
            result[name] = _der(probs, ref, best)
            result[f"{name}_recordings"] = len({w.rsplit("_w", 1)[0] for w in probs})
            result[f"{name}_windows_by_speakers"] = speaker_counts(ref)
    return result


def _meta(cfg: RecipeConfig, data: pathlib.Path, train_seconds: float) -> dict:
    """The model file's provenance (``provenance.py``)."""
    train = [data / name for name in _train_names(cfg)]
    return {"max_local_speakers": cfg.n_speakers, "window_seconds": cfg.frames * 0.1,
            "recipe": asdict(cfg), "train_sources": provenance.folder_sources(train),
            "versions": provenance.versions(), "train_seconds": round(train_seconds, 1),
            "torch_threads": torch.get_num_threads()}


def tune_recipe_pipeline(model_path: pathlib.Path, data: pathlib.Path, cfg: RecipeConfig, jobs: int = 1) -> dict:
    """Choose the pipeline's settings for the model at ``model_path`` on ``data/dev`` (and ``cfg.dev_extra``),
    score the test sets once, and store the choice in the model file; returns the tuning without its grid."""
    from ..pipeline.api import every_encoder
    from ..pipeline.segment_cache import remove as remove_segments
    from ..pipeline.segment_cache import segments_beside
    from ..pipeline.tuning import SEGMENT_GRID, STITCH_GRID, parse_grid, tune_pipeline

    model = EENDModel.load(model_path)
    grids = parse_grid([g for g in cfg.tune_grid.split(";") if g.strip()], (SEGMENT_GRID, STITCH_GRID))
    dev = [data / name for name in ("dev", "dev_mixed", "dev_synth", "dev_stretch")
           if (data / name / "ref.rttm").exists()]
    dev += [pathlib.Path(d) for d in cfg.dev_extra.split(",") if d]
    tests = {name: [data / name] for name in ("test", "test_mixed", "test_synth", "test_stretch")
             if (data / name / "ref.rttm").exists()}
    cache = segments_beside(model_path.with_name("tuning"))  # a stopped recipe's tuning resumes from it
    result = tune_pipeline(model, every_encoder(), dev, tests, segment_grid=grids[0], stitch_grid=grids[1],
                           jobs=jobs, incumbent=model.postprocess.get("modes"), cache=cache)
    provenance.write_pipeline(model_path, result["modes"], result["speakers"],
                              {k: v for k, v in result.items() if k != "grid"}, result["whitened"],
                              result.get("ahc"), result.get("vbx"), result.get("encoders"),
                              result["readings"].get("vad_speech"))
    remove_segments(cache)  # the choice is stored: the segmentations are no longer needed
    return {k: v for k, v in result.items() if k != "grid"}


def whiten_recipe_model(model_path: pathlib.Path, data: pathlib.Path, cfg: RecipeConfig, jobs: int = 1) -> dict:
    """Fit the speaker embeddings' whitening and PLDA model on the first ``cfg.whiten_per_folder`` conversations
    of ``data/train`` and ``data/train_real`` and store them in the model file; returns what it was fitted on (or
    why not: a model with no piece of one voice in them, e.g. barely trained, has nothing to fit)."""
    from ..._checks import BadValue
    from ..models.embed import SpeakerEncoder
    from ..pipeline.whiten import fit_files

    dirs = [data / name for name in ("train", "train_real") if (data / name / "ref.rttm").exists()]
    try:
        fitted = fit_files(EENDModel.load(model_path), SpeakerEncoder.load(), dirs, lam=cfg.whiten_lam,
                           per_folder=cfg.whiten_per_folder, jobs=jobs)
    except BadValue as e:
        return {"fitted": False, "reason": str(e)}
    provenance.write_whitening(model_path, fitted)
    plda = fitted.get("plda")
    return {"fitted": True, **{k: v for k, v in fitted.items() if k not in ("matrix", "plda")},
            "plda": {"pieces": plda["pieces"], "speakers": plda["speakers"]} if plda else None}


def run_recipe(out: str | pathlib.Path, cfg: RecipeConfig = RecipeConfig(), *, data: str | pathlib.Path | None = None,
               progress: Progress | None = None, jobs: int = 1, overwrite: bool = False) -> dict:
    """Simulate (into ``data``, default ``out/data``), train, tune, score; write ``out/model.pt`` and
    ``out/results.json``. Every stage resumes: mixtures and features on disk are reused, training restarts
    from its last checkpoint, and a finished training is not repeated. One recipe at a time in ``out`` (a
    second stops with one line); a ``model.pt`` or ``results.json`` there that no recipe wrote is replaced only
    with ``overwrite``, checked before any work."""
    from ...locks import folder_lock

    cfg.check()
    out = pathlib.Path(out)
    _check_outputs(out, overwrite)
    with folder_lock(out, "written by a recipe", "wait for it to finish (or stop it), or give another --out"):
        return _run(out, cfg, data, progress, jobs)


def _check_outputs(out: pathlib.Path, overwrite: bool) -> None:
    """Refuse (one line) a ``model.pt`` or ``results.json`` in ``out`` that no recipe wrote, or that changed
    since: normlab's list of what it wrote there holds it unchanged, or, not in that list, it records a recipe's
    settings (as every recipe's files do). A listed file changed since (settings stored by ``diarize tune
    --save``, a whitening) is the user's: a rerun dropped them without a word."""
    from ... import written

    ours = written.listed(out)

    def a_recipes(f: pathlib.Path) -> bool:
        try:
            meta = provenance.read(f) if f.suffix == ".pt" else json.loads(f.read_text()).get("meta", {})
            return isinstance(meta, dict) and isinstance(meta.get("recipe"), dict)
        except Exception:  # noqa: BLE001   (not a model or not JSON: not a recipe's)
            return False

    theirs = [f for f in (out / "model.pt", out / "results.json") if f.exists() and (f.name in ours
                                                                                      or not a_recipes(f))]
    written.check(theirs, overwrite=overwrite, hint="give the recipe another --out")


def _check_steps(out: pathlib.Path, cfg: RecipeConfig) -> None:
    """A rerun asks for at least the steps each stage's checkpoint holds: with fewer, the model of the longer
    run was written as trained for the shorter one (its recipe and results named the steps asked)."""
    for stage, steps, option in (("ckpt", cfg.steps, "steps"), ("ckpt_finetune", cfg.finetune_steps,
                                                                   "finetune_steps")):
        last = out / stage / "last.pt"
        if steps and last.exists() and (done := read_checkpoint(last)["step"]) > steps:
            raise BadValue(f"{last} holds {done} steps of training, more than the {steps} asked ({option}): ask "
                           f"for {done} or more to resume it, or give another --out")


def _run(out: pathlib.Path, cfg: RecipeConfig, data, progress, jobs: int) -> dict:
    from ... import written

    _check_steps(out, cfg)  # before the simulation
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data = simulate_splits(data or out / "data", cfg, progress, jobs, which="train")
    t1 = time.time()
    model, losses = train_model(data, out, cfg, progress)
    if cfg.finetune_steps:
        model, losses = finetune_model(data, out, cfg, model, progress)
    t2 = time.time()
    simulate_splits(data, cfg, progress, jobs, which="eval")
    t3 = time.time()
    train_seconds = sum(read_checkpoint(out / stage / "last.pt").get("seconds", 0.0)
                        for stage in ("ckpt", "ckpt_finetune") if (out / stage / "last.pt").exists()) or t2 - t1
    result = {"config": asdict(cfg), **score_model(model, data, cfg.frames),
              "final_loss": sum(losses[-50:]) / len(losses[-50:]),
              "parameters": sum(p.numel() for p in model.parameters()),
              "seconds": {"simulate": round(t1 - t0 + t3 - t2, 1), "train": round(train_seconds, 1),
                          "score": round(time.time() - t3, 1)}}
    meta = _meta(cfg, data, train_seconds)
    result["meta"] = meta
    tmp = out / "model.pt.tmp"
    model.save(tmp)
    provenance.write(tmp, meta)
    if cfg.whiten_lam > 0:
        t4 = time.time()
        result["whitening"] = whiten_recipe_model(tmp, data, cfg, jobs)
        result["seconds"]["whitening"] = round(time.time() - t4, 1)
    if cfg.tune_grid != "none":  # the whole pipeline's settings, chosen on the dev set (pipeline/tuning.py)
        t4 = time.time()
        result["pipeline"] = tune_recipe_pipeline(tmp, data, cfg, jobs)
        result["seconds"]["pipeline"] = round(time.time() - t4, 1)
    tmp.replace(out / "model.pt")  # never a half-written model file
    written.record(out / "model.pt")
    written.write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    return result
