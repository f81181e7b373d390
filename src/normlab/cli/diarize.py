"""``normlab diarize``: who spoke when (RTTM), DER scoring, simulation, training and the recipe."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys

from ..devices import HELP as DEVICE_HELP
from ..devices import HELP_TORCHRUN, check_spec
from ._common import (
    OVERWRITE,
    OVERWRITE_HELP,
    HelpFormatter,
    a_folder,
    a_path,
    flag,
    jobs,
    number,
    positive_int,
    progress,
    renamed,
    seed,
    threads,
)

HELP = {"diarize": "speaker diarization: AUDIO... to RTTM, and DER scoring"}

#: subcommands; any other first word is an audio file: ``normlab diarize AUDIO...`` is ``diarize run AUDIO...``
COMMANDS = ("score", "run", "evaluate", "simulate", "train", "recipe", "tune", "whiten")


_seconds = number(float, lambda v: math.isfinite(v) and v >= 0, "a finite number of seconds >= 0")  # --collar
_rate = number(float, lambda v: 0 < v <= 1e3, "a number in (0, 1000]")  # --lr, --lam
_steps = number(int, lambda v: v >= 0, "a whole number >= 0")  # --warmup
#: --median: a centred window of frames (1001 frames is 100 s; wider only smears a recording into one turn)
_odd = number(int, lambda v: 1 <= v <= 1001 and v % 2 == 1, "an odd whole number from 1 to 1001")
_gap = number(float, lambda v: 0 <= v <= 3600, "a number of seconds from 0 to 3600")  # --fill-gap
_db = number(float, lambda v: 0 <= v <= 100, "a number of dB from 0 to 100")  # --flat-db
_unit = number(float, lambda v: 0 <= v <= 1, "a number from 0 to 1")  # --offset-threshold
_width = number(int, lambda v: v >= 4 and v % 4 == 0, "a multiple of 4, the encoder's heads")  # train --d-model


def _read_only(path) -> bool:
    """No write permission for us, or none for anyone (a file made read-only, even where root could write)."""
    p = pathlib.Path(path)
    return p.exists() and (not os.access(p, os.W_OK) or not p.stat().st_mode & 0o222)


def _recordings_folder(d: str, takes: str) -> None:
    """NotFound (one line) unless ``d`` is a folder; a file there is named as a file, not as missing."""
    from .._checks import NotFound

    if not pathlib.Path(d).is_dir():
        what = "a file, not a folder" if pathlib.Path(d).exists() else "no such folder"
        raise NotFound(f"{d}: {what} ({takes} folders of WAVs and their ref.rttm)")


def _rttm_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The RTTM file ``path``, or every ``*.rttm`` in the folder ``path``."""
    return sorted(path.glob("*.rttm")) if path.is_dir() else [path]


def _read_rttms(paths: list[str], reference: frozenset = frozenset()) -> dict:
    """Turns of RTTM files and of every ``*.rttm`` in folders, by recording; a recording with turns in two files
    is an error (merged, its turns would be counted twice). ``reference``: the reference's files (their real
    paths), left out of the folders (a reference inside the hypothesis folder was scored as its own hypothesis:
    0.00% DER, without a word); a file named is read, whatever it is (a reference scored against itself)."""
    from .. import written
    from .._checks import BadValue, NotFound
    from ..diarization.io.rttm import read_rttm

    turns: dict = {}
    origin: dict = {}
    for path in dict.fromkeys(map(pathlib.Path, paths)):  # a file named twice is read once
        files = [f for f in _rttm_files(path) if not path.is_dir() or written.resolved(f) not in reference]
        if not files:
            raise NotFound(f"{path} has no .rttm files{' but the reference' if path.is_dir() and reference else ''}")
        for f in files:
            for uri, ts in read_rttm(f).items():
                if uri in origin:
                    raise BadValue(f"recording {uri!r} has turns in two files, {origin[uri]} and {f}: give each "
                                   "recording's turns in one file")
                turns[uri], origin[uri] = ts, f
    return turns


def _cmd_diarize_score(args: argparse.Namespace) -> int:
    from .. import written
    from .._checks import BadValue
    from ..diarization.io.uem import read_uem, uncovered
    from ..diarization.metrics.der import score

    ref = _read_rttms([args.ref])
    hyp = _read_rttms(args.hyp, reference=frozenset(map(written.resolved, _rttm_files(pathlib.Path(args.ref)))))
    if not ref:
        raise BadValue(f"nothing to score: {args.ref} has no speaker turns (no SPEAKER line)")
    uem = read_uem(args.uem) if args.uem else None
    outside = uncovered(ref, uem)  # a UEM lists the regions to score: these have none
    if len(outside) == len(ref):
        raise BadValue(f"{args.uem} has no regions of the reference's {len(ref)} recordings"
                       f"{'' if uem else ' (it has no regions at all)'}: nothing would be scored")
    result = score(ref, hyp, collar=args.collar, skip_overlap=args.skip_overlap, uem=uem)
    if result.total == 0:
        raise BadValue(f"nothing to score: the reference has no speech{' inside the UEM' if uem else ''}"
                       f"{' outside the collars' if args.collar > 0 else ''}"
                       f"{' outside overlap' if args.skip_overlap else ''} ({len(ref)} recordings)")
    unknown = sorted(set(hyp) - set(ref))
    if unknown:
        print(f"warning: {len(unknown)} hypothesis recordings are not in the reference and are not scored: "
              f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}", file=sys.stderr)
    if outside:
        print(f"warning: {len(outside)} reference recordings have no region in {args.uem} and are not scored: "
              f"{', '.join(outside[:5])}{' ...' if len(outside) > 5 else ''}", file=sys.stderr)
    print(result.format())
    print(f"  recordings: {len(ref) - len(outside)}; collar {args.collar:g} s each side of reference boundaries"
          f"{'; overlap skipped' if args.skip_overlap else ''}")
    return 0


def _speaker_counts(args: argparse.Namespace) -> dict:
    return {"num_speakers": args.num_speakers, "min_speakers": args.min_speakers, "max_speakers": args.max_speakers}


def _pipeline_options(args: argparse.Namespace) -> dict:
    """Options the user set; the rest come from the model file (the same defaults as the Python API)."""
    return {k: v for k, v in (("threshold", args.threshold), ("overlap_threshold", args.overlap_threshold),
                              ("median", args.median), ("speakers", args.local_speakers), ("vad", args.vad),
                              ("whiten", args.whiten), ("clustering", args.clustering), ("flat_db", args.flat_db),
                              ("fill_gap", args.fill_gap), ("speaker_encoder", args.speaker_encoder),
                              ("reassign", args.reassign), ("offset_threshold", args.offset_threshold))
            if v is not None}


def _model_on_device(args: argparse.Namespace):
    """The EEND model of ``--model`` on ``--device``: the pipeline runs it where it is."""
    from ..devices import resolve
    from ..diarization.pipeline.api import load_model

    return load_model(args.model).to(resolve(args.device))


def _cmd_diarize_run(args: argparse.Namespace) -> int:
    from ..diarization.pipeline.api import DONE, diarize_files, outputs

    found = {}
    status = diarize_files(args.audio, args.out, model=_model_on_device(args), embedding=args.embedding,
                           format=args.format, exclusive=args.exclusive, plot=args.plot, overwrite=args.overwrite,
                           progress=progress("diarize"), on_result=found.__setitem__, **_speaker_counts(args),
                           **_pipeline_options(args))
    for path, st in status.items():
        wrote = " and ".join(map(str, outputs(path, args.out, args.format, args.plot)))
        if st == "ok":
            print(f"{path}: wrote {wrote} ({_found(found[path])})")
        elif st == "kept":  # a rerun: written before from the same audio, model and settings
            print(f"{path}: kept {wrote}, made from the same audio and settings ({_found(found[path])})")
        else:  # the other files are written; this one's error goes where errors go (its path said once)
            print(f"{path}: error: {st.removeprefix(f'{path}: ')}", file=sys.stderr)
    return 0 if all(st in DONE for st in status.values()) else 1


def _found(result) -> str:
    """What a file's diarization found, in a few words: its speakers and their speech, or that there is none."""
    if not result.turns:
        return "no speech found"
    speakers = len(result.speakers)
    return f"{speakers} speaker{'s' * (speakers != 1)}, {result.speech_seconds:.1f} s of speech in " \
           f"{result.duration:.1f} s"


def _cmd_diarize_evaluate(args: argparse.Namespace) -> int:
    import json

    from ..diarization.metrics.evaluate import evaluate_folder, format_errors, format_evaluation

    result = evaluate_folder(args.wav_dir, args.ref, args.out, uem=args.uem, html=args.html,
                             overwrite=args.overwrite, model=_model_on_device(args), embedding=args.embedding,
                             progress=progress("diarize"), **_speaker_counts(args), **_pipeline_options(args))
    print(json.dumps(result, indent=2) if args.json else format_evaluation(result))
    if result["errors"] and not args.json:  # as `diarize run`: each file that failed, on stderr
        print(format_errors(result), file=sys.stderr)
    if args.html:  # (with --json, stdout holds the JSON alone)
        print(f"wrote {result['html']}", file=sys.stderr if args.json else sys.stdout)
    return 0 if not result["errors"] else 1


def _cmd_diarize_simulate(args: argparse.Namespace) -> int:
    from .._checks import BadValue
    from ..diarization.data.simulate import SimConfig, simulate

    # what shapes EEND-style mixtures only, given: a conversation draws its turns and rooms its own way, and wrote
    # the same audio whatever these said, while its config.json recorded them as applied
    timeline = {"beta": args.beta, "min_utterances": args.min_utterances, "max_utterances": args.max_utterances,
                "rt60": tuple(args.rt60) if args.rt60 else None, "beta_by_count": args.beta_by_count or None}
    given = {k: v for k, v in timeline.items() if v is not None}
    # and who speaks: style 'nonspeech' has nobody (a count or voices other than the defaults were ignored too)
    voiced = [o for o, v, default in (("--n-speakers", args.n_speakers, 2), ("--min-speakers", args.min_speakers, 0),
                                      ("--sources", args.sources, "espeak")) if v != default]
    unused = [*("--" + k.replace("_", "-") for k in given), *(voiced if args.style == "nonspeech" else [])]
    if unused and args.style != "mixture":
        what, how = {"conversation": ("style 'mixture' (EEND's independent timelines)",
                                      "draws its turns, pauses and rooms its own way"),
                     "nonspeech": ("the speakers of the other styles",
                                   "writes sounds alone, nobody speaking")}[args.style]
        raise BadValue(f"{', '.join(unused)} shape{'s' * (len(unused) == 1)} {what}; style {args.style!r} {how}: "
                       f"leave {'them' if len(unused) > 1 else 'it'} out")
    cfg = SimConfig(n_mixtures=args.n_mixtures, n_speakers=args.n_speakers, split=args.split, seed=args.seed,
                    min_speakers=args.min_speakers, sources=args.sources, augment=args.augment, style=args.style,
                    stretch_p=args.stretch_p, duration=tuple(args.duration) if args.duration else None, **given)
    out = simulate(args.out, cfg, progress=progress("simulate"), jobs=args.jobs)
    print(f"wrote {cfg.n_mixtures} mixtures to {out}/wav, {out}/ref.rttm, {out}/all.uem")
    return 0


def _rank_threads() -> int:
    """``diarize train``'s default threads: 2, or under a launcher the cores shared among this machine's ranks
    (2 each oversubscribed a 2-core machine running 2 ranks)."""
    import os

    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    # (isascii: "²" is a digit to isdigit, not to int)
    return max(1, (os.cpu_count() or 1) // int(local)) if local.isascii() and local.isdigit() and int(local) > 1 else 2


def _cmd_diarize_train(args: argparse.Namespace) -> int:
    import torch

    from ..diarization.models.eend import ModelConfig
    from ..diarization.training.train import TrainConfig, train_run

    torch.set_num_threads(args.threads or _rank_threads())
    model_cfg = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, d_ff=4 * args.d_model,
                            n_speakers=args.n_speakers,
                            norm=args.norm, placement=args.placement, encoder=args.encoder, head=args.head)
    cfg = TrainConfig(steps=args.steps, lr=args.lr, warmup=args.warmup, ckpt_every=args.ckpt_every, seed=args.seed,
                      decay=args.decay)
    out = pathlib.Path(args.out)
    bar = progress("train")
    r = train_run(args.data, out, model_cfg, cfg, batch=args.batch, frames=args.frames, device=args.device,
                  tensorboard=args.tensorboard,
                  progress=lambda step, total, loss: bar(step - 1, total, f"loss {loss:.4f}"))
    if r["rank"] == 0 and r["diverged"]:
        d = r["diverged"]
        print(f"normlab diarize train: diverged at step {d['step']} (loss {d['loss']:.4g}, gradient norm "
              f"{d['grad_norm']:.4g}); {out / 'model.pt'} holds the weights of step {d['step'] - 1}, marked diverged "
              "in its metadata; train again with a lower --lr into another --out", file=sys.stderr)
        return 1
    if r["rank"] == 0:
        losses = r["losses"]
        speed = (f"{r['samples_per_s']:.1f} sequences/s" if r["steps"] else
                 "no step left to train: the checkpoint had reached --steps")
        model = (f"wrote {out / 'model.pt'}" if r["model_written"] else
                 f"{out / 'model.pt'} left as it is (what was stored in it since is kept)")
        metrics = f" and {out / 'ckpt' / 'metrics.csv'}" if r["steps"] else ""  # (a rerun with no step writes none)
        session = f" ({r['steps']} in this session)" if 0 < r["steps"] < len(losses) else ""  # a resumed run
        print(f"trained {len(losses)} steps{session} on {r['mixtures']} mixtures ({r['world_size']} process"
              f"{'es' if r['world_size'] > 1 else ''}, {r['device']}; {speed}); "
              f"final loss {sum(losses[-20:]) / len(losses[-20:]):.4f}; {model}{metrics}")
    return 0


def _cmd_diarize_tune(args: argparse.Namespace) -> int:
    import json

    from .. import written
    from .._checks import BadValue
    from ..diarization.models.eend import SHIPPED, model_path
    from ..diarization.models.weights import is_asset, sha256
    from ..diarization.pipeline.api import every_encoder, load_model
    from ..diarization.pipeline.segment_cache import remove as remove_segments
    from ..diarization.pipeline.segment_cache import segments_beside
    from ..diarization.pipeline.tuning import SEGMENT_GRID, STITCH_GRID, parse_grid, tune_pipeline
    from ..diarization.training.provenance import write_pipeline
    from ..provenance import record

    if args.save and args.model is None:
        raise BadValue("--save writes into the model file: give it with --model (the shipped model is read-only)")
    if args.save and (is_asset(model_path(args.model)) or _read_only(args.model)):  # a shipped one, by name too
        raise BadValue(f"--save would rewrite {args.model}, which is read-only or one of normlab's own model files: "
                       "copy it first")
    tests = {}
    for item in args.test:
        name, _, dirs = item.rpartition("=")
        name = name or pathlib.Path(dirs.split(",")[0]).name
        if name in tests:  # the later set replaced the earlier one, which was never scored
            raise BadValue(f"--test {item}: a second test set named {name!r}; name each as NAME=DIR")
        tests[name] = dirs.split(",")
    # everything the grid's end needs, checked before the grid runs (it takes many minutes)
    for option, dirs in (("--dev", args.dev.split(",")), ("--test", [d for ds in tests.values() for d in ds])):
        for d in dirs:
            if not d.strip():
                raise BadValue(f"{option}: an empty folder name (the current folder is never meant)")
            _recordings_folder(d, "--dev and --test take")
    out = pathlib.Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise BadValue(f"--out {out}: cannot write a file there (a folder, or its folder is missing)")
    written.writable_folder(out.parent)  # a file is made there, not asked of os.access (root passes it on /proc)
    read = _tune_inputs(args, [args.dev.split(","), *tests.values()])
    if written.resolved(out) in read:  # even with --overwrite: the result would replace what it is made from
        raise BadValue(f"--out {out} is the {read[written.resolved(out)]} this tuning reads: give another --out")
    written.check([out], overwrite=args.overwrite, hint="give another --out")
    grids = parse_grid(args.grid, (SEGMENT_GRID, STITCH_GRID))
    # the grid's encoder (GE2E, or --embedding's weights), then every other shipped one on each mode's choice
    model, encoder = load_model(args.model), every_encoder(args.embedding)

    def show(row: dict, seconds: float) -> None:  # one line per setting tried: a long job shows its progress
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
              f"{seconds:.0f}s", file=sys.stderr, flush=True)

    cache = segments_beside(out)  # what a stopped run made: the rerun resumes from it
    result = tune_pipeline(model, encoder, args.dev.split(","), tests, segment_grid=grids[0], stitch_grid=grids[1],
                           jobs=args.jobs, progress=show, incumbent=model.postprocess.get("modes"), cache=cache)
    run = {"dev": args.dev.split(","), "test": tests, "grid": args.grid, "embedding": args.embedding,
           "jobs": args.jobs, "save": args.save}  # what made the file, beside the versions
    files = {"model": model_path(args.model), "embedding": args.embedding}  # what was tuned, by content too
    digests = {f"{k}_sha256": sha256(v) for k, v in files.items() if v is not None}
    if args.save:  # before the result file, which says it was stored (a full disk stopped the save after it)
        write_pipeline(args.model, result["modes"], result["speakers"],
                       {k: v for k, v in result.items() if k != "grid"}, result["whitened"], result.get("ahc"),
                       result.get("vbx"), result.get("encoders"), result["readings"].get("vad_speech"))
    written.write_text(out, json.dumps({"model": str(args.model or SHIPPED), **digests, **result, "command": run,
                                        "provenance": record()}, indent=1) + "\n")
    remove_segments(cache)  # the result is kept: the segmentations are no longer needed
    print(format_tuning(result))
    print(f"wrote {args.out}" + (f"; stored the choice in {args.model}" if args.save else ""))
    return 0


def _tune_inputs(args: argparse.Namespace, sets: list[list[str]]) -> dict:
    """``{resolved path: what it is}`` of every file ``tune`` reads: the model, the encoder's weights, and each
    dev and test folder's references and audio."""
    from .. import written
    from ..diarization.models.eend import model_path

    found = {written.resolved(model_path(args.model)): "model"} if args.model is not None else {}
    if args.embedding is not None:
        found[written.resolved(args.embedding)] = "speaker encoder's weights"
    for d in (pathlib.Path(d) for ds in sets for d in ds):
        for f in [*d.glob("*.rttm"), *d.glob("*.uem"), *d.glob("*.wav"), *d.glob("wav/*")]:
            found[written.resolved(f)] = "reference" if f.suffix in (".rttm", ".uem") else "audio"
    return found


def _cmd_diarize_whiten(args: argparse.Namespace) -> int:
    from .._checks import BadValue
    from ..diarization.models.eend import model_path
    from ..diarization.models.weights import is_asset
    from ..diarization.pipeline.api import load_encoder, load_model
    from ..diarization.pipeline.whiten import fit_files
    from ..diarization.training.provenance import write_whitening

    if is_asset(model_path(args.model)) or _read_only(args.model):  # a shipped one, by name too
        raise BadValue(f"{args.model} is read-only or one of normlab's own model files: copy it first")
    for d in args.train:
        if not d.strip():
            raise BadValue("--train: an empty folder name (the current folder is never meant)")
        _recordings_folder(d, "--train takes")
    model, encoder = load_model(args.model), load_encoder(args.embedding)
    fitted = fit_files(model, encoder, args.train, lam=args.lam, per_folder=args.per_folder, jobs=args.jobs,
                       progress=progress("segment"))
    if "plda" not in fitted and (model.whitening or {}).get("plda") is not None:
        raise BadValue(f"these recordings give no PLDA model ({fitted['speakers']} speaker(s) with pieces to fit): "
                       f"storing the whitening alone would remove {args.model}'s PLDA model; fit on more speakers")
    if fitted["speakers"] < 10:
        import warnings

        warnings.warn(f"fitted on {fitted['pieces']} pieces of {fitted['speakers']} speaker(s): a whitening learns "
                      "one voice's spread from many speakers; expect little of this one", UserWarning, stacklevel=2)
    write_whitening(args.model, fitted)
    plda = " and a PLDA model" if "plda" in fitted else ""
    print(f"whitening{plda} fitted on {fitted['pieces']} pieces of {fitted['speakers']} speakers in "
          f"{fitted['recordings']} recordings (lam {fitted['lam']:g}); stored in {args.model}. "
          f"`normlab diarize tune --model {args.model} --save` chooses the settings --whiten and VBx use")
    return 0


def format_tuning(result: dict) -> str:
    """The dev choice per mode and every test set's scores, one line each."""
    def line(r):
        return (f"DER {100 * r['der_0.25']:.2f}% / {100 * r['der_0']:.2f}% (collar 0.25 / 0; missed "
                f"{100 * r['missed']:.1f}%, false alarm {100 * r['false_alarm']:.1f}%, confusion "
                f"{100 * r['confusion']:.1f}%), speaker count right on {100 * r['count_right']:.0f}% of files, "
                + ("no overlap output" if r["overlap_precision"] is None else
                   f"overlap precision {r['overlap_precision']:.2f}"))
    out = [f"dev ({result['dev_files']} files, {len(result.get('grid', []))} settings): default mode "
           f"{result['speakers']}"]
    choice = result.get("mode_choice", {})
    if choice.get("other_better_share") is not None:
        out[0] += (f" ({choice['other']} mode lower in {100 * choice['other_better_share']:.0f}% of bootstrap "
                   f"resamples of the dev files; it needs {100 * choice['beyond_doubt']:.0f}% to be the default)")
    for m, kw in result["modes"].items():
        out.append(f"  {m}: {kw}")
    for name, shares in result.get("encoder_better_share", {}).items():
        for m, share in shares.items():
            out.append(f"  {m} with --speaker-encoder {name}: {result['encoders'][name][m]} (its best lower than "
                       f"the grid's choice in {100 * share:.0f}% of bootstrap resamples of the dev files)")
    for m, share in result.get("vbx_better_share", {}).items():
        out.append(f"  {m} with --clustering vbx: {result['vbx'][m]} (lower than the choice in {100 * share:.0f}% "
                   "of bootstrap resamples of the dev files)")
    for name, r in result["dev_scores"].items():
        out.append(f"  dev, {name}: {line(r)}")
    for key in (k for k in result if k.startswith("test:")):
        for name, r in result[key].items():
            out.append(f"  {key[5:]} (scored once), {name}: {line(r)}")
    return "\n".join(out)


def _cmd_diarize_recipe(args: argparse.Namespace) -> int:
    import torch

    from ..diarization.training.recipe import RecipeConfig, run_recipe, train_recordings

    torch.set_num_threads(args.threads)
    # the field's own type: an on/off option (a bool) keeps a 0/1 field's value as the dataclass writes it
    cfg = RecipeConfig(**{f.name: type(f.default)(getattr(args, f.name)) for f in dataclasses.fields(RecipeConfig)})
    result = run_recipe(args.out, cfg, data=args.data, progress=progress("recipe"), jobs=args.jobs,
                        overwrite=args.overwrite)
    pp = result["postprocess"]
    print(f"trained {cfg.steps} steps on {train_recordings(cfg)} recordings of up to "
          f"{cfg.n_speakers} speakers ({cfg.frames / 10:g} s windows, {cfg.n_speakers} outputs; "
          f"{result['parameters']:,} parameters), final loss {result['final_loss']:.4f}")
    print(f"dev ({cfg.n_dev} mixtures): threshold {pp['threshold']:g}, median {pp['median']} -> "
          f"DER {100 * result['dev_der']:.2f}%")
    print(f"DER per {cfg.frames / 10:g} s window (local; speakers matched per window), each set scored once:")
    sets = [(k, what) for k, what in (("test", "unseen voices, perturbed"), ("test_mixed", "unseen people and voices"),
                                      ("test_dry", "unseen voices, clean"),
                                      ("test_reverb", "unseen voices, reverberant"), ("flite", "flite voices"))
            if k in result]
    for key, what in sets:
        for name, r in result[key].items():
            print(f"{key} ({result[key + '_recordings']} mixtures, {what}), {name.replace('_', ' ')} s: "
                  f"DER {100 * r['der']:.2f}% (false alarm {100 * r['false_alarm']:.2f}%, missed "
                  f"{100 * r['missed']:.2f}%, confusion {100 * r['confusion']:.2f}%)")
    if "pipeline" in result:
        print("pipeline settings chosen on the dev set (stored in the model file):")
        print(format_tuning(result["pipeline"]))
    print(f"wrote {args.out}/model.pt and {args.out}/results.json ({sum(result['seconds'].values()):.0f} s)")
    return 0


def add_parsers(sub, name: str) -> None:
    from ..diarization.models.eend import ENCODERS, HEADS
    from ..registry import NORMS, PLACEMENTS
    from .recipe_options import add_recipe_options

    dia = sub.add_parser("diarize", help=HELP["diarize"], description=HELP["diarize"] +
                         ". `normlab diarize AUDIO...` is `normlab diarize run AUDIO...`.")
    dsub = dia.add_subparsers(dest="diarize_command", required=True, metavar="COMMAND")
    d = "(default: %(default)s)"

    sc = dsub.add_parser("score", help="diarization error rate of HYP against REF (RTTM files)")
    sc.add_argument("ref", type=a_path, help="reference RTTM file, or a folder of them")
    sc.add_argument("hyp", nargs="+", type=a_path,
                    help="hypothesis RTTM files, or folders of them (e.g. the --out of diarize)")
    sc.add_argument("--collar", type=_seconds, default=0.25,
                    help=f"seconds forgiven on each side of every reference boundary (md-eval's -c) {d}")
    flag(sc, "--skip-overlap", "do not score overlapped reference speech")
    sc.add_argument("--uem", type=a_path, help="UEM file: score only these regions (default: from the first turn "
                    "to the last, of reference and hypothesis)")
    sc.set_defaults(func=_cmd_diarize_score)

    si = dsub.add_parser("simulate", help="simulate conversations with synthesized voices (EEND recipe)")
    si.add_argument("--out", required=True, type=a_folder, help="output folder (re-running resumes; required)")
    si.add_argument("--n-mixtures", type=positive_int, default=100, help=f"mixtures to simulate {d}")
    si.add_argument("--n-speakers", type=positive_int, default=2,
                    help=f"speakers per mixture (the most, with --min-speakers) {d}")
    si.add_argument("--min-speakers", type=int, default=0,
                    help="> 0: mixtures cycle through MIN..--n-speakers speakers (default: 0, always --n-speakers)")
    si.add_argument("--beta", type=float, help="mixture style: mean silence before an utterance, s (default: 2.0)")
    si.add_argument("--split", choices=["train", "dev", "test", "flite"], default="train",
                    help=f"disjoint voice sets {d}")
    si.add_argument("--min-utterances", type=positive_int,
                    help="mixture style: utterances per speaker, at least (default: 5)")
    si.add_argument("--max-utterances", type=positive_int,
                    help="mixture style: utterances per speaker, at most (default: 20)")
    si.add_argument("--seed", type=seed, default=0, help=f"random seed {d}")
    si.add_argument("--jobs", type=jobs, default=2, help=f"worker processes (the same files for any) {d}")
    si.add_argument("--rt60", type=float, nargs=2, metavar=("MIN", "MAX"),
                    help="mixture style: add reverberation, RT60 drawn from [MIN, MAX] seconds (default: dry)")
    si.add_argument("--sources", choices=["espeak", "all"], default="espeak",
                    help=f"voices: espeak-ng only, or also the recorded flite and festival voices {d}")
    si.add_argument("--style", choices=["mixture", "conversation", "nonspeech"], default="mixture",
                    help="mixture: EEND's independent timelines; conversation: turn-taking; nonspeech: sounds alone "
                    f"(noise, hum, music, typing), nobody speaking {d}")
    si.add_argument("--stretch-p", type=float, default=0.0,
                    help=f"conversation style: probability of a 3-12 s pause filled with a sound {d}")
    si.add_argument("--duration", type=float, nargs=2, metavar=("MIN", "MAX"),
                    help="conversation style: seconds of talk per recording, drawn from [MIN, MAX] (default: 20 45)")
    flag(si, "--augment", "perturb: speaker warps and levels, rooms, noise types, telephone, gain")
    flag(si, "--beta-by-count", "mixture style: more speakers, longer silences (EEND-EDA: beta x1, x1, x2.5, x4.5 "
         "for 1-4 speakers)")
    renamed(si, n="--n-mixtures", speakers="--n-speakers")
    si.set_defaults(func=_cmd_diarize_simulate, resumes=True)

    tr = dsub.add_parser("train", help="train an EEND model on simulated mixtures (resumes from OUT/ckpt)",
                         description="Train an EEND model on simulated mixtures; resumes from OUT/ckpt. Data-parallel "
                         "with `torchrun --nproc_per_node N -m normlab diarize train ...` (gloo on CPU, nccl on CUDA; "
                         "--batch is the global batch, split over the processes).")
    tr.add_argument("--data", required=True, type=a_path,
                    help="a folder written by `normlab diarize simulate` (required)")
    tr.add_argument("--out", required=True, type=a_folder,
                    help="writes OUT/model.pt and checkpoints in OUT/ckpt (required)")
    tr.add_argument("--steps", type=positive_int, default=2000, help=f"optimizer steps {d}")
    tr.add_argument("--lr", type=_rate, default=1e-3, help=f"peak learning rate {d}")
    tr.add_argument("--warmup", type=_steps, default=200, help=f"linear warmup steps {d}")
    tr.add_argument("--decay", choices=["none", "cosine"], default="none", help=f"after warmup {d}")
    tr.add_argument("--batch", type=positive_int, default=8, help=f"mixtures per step {d}")
    tr.add_argument("--frames", type=positive_int, default=500, help=f"100 ms frames per training window {d}")
    tr.add_argument("--d-model", type=_width, default=128, help=f"encoder width, a multiple of its 4 heads {d}")
    tr.add_argument("--n-layers", type=positive_int, default=2, help=f"encoder layers {d}")
    tr.add_argument("--n-speakers", type=positive_int, default=2, help=f"speaker outputs of the model {d}")
    tr.add_argument("--norm", choices=list(NORMS), default="layernorm", help=f"the encoder's norm {d}")
    tr.add_argument("--placement", choices=list(PLACEMENTS), default="pre", help=f"where the norms go {d}")
    tr.add_argument("--encoder", choices=ENCODERS, default="transformer", help=f"encoder type {d}")
    tr.add_argument("--head", choices=HEADS, default="multilabel",
                    help=f"output head: one sigmoid per speaker, or a softmax over sets of speakers {d}")
    tr.add_argument("--ckpt-every", type=positive_int, default=100, help=f"steps between checkpoints {d}")
    tr.add_argument("--threads", type=threads, default=None, help="torch threads per process (default: 2; under "
                    "torchrun the machine's cores shared among its ranks)")
    tr.add_argument("--seed", type=seed, default=0, help=f"random seed {d}")
    tr.add_argument("--device", type=check_spec, default="cpu", help=f"{HELP_TORCHRUN} {d}")
    tr.add_argument("--tensorboard", type=a_path, default=None, metavar="DIR",
                    help="also log loss, lr and gradient norm for TensorBoard in DIR (needs normlab[scale]; "
                    "default: no log)")
    renamed(tr, layers="--n-layers", speakers="--n-speakers")
    tr.set_defaults(func=_cmd_diarize_train, resumes=True)

    def pipeline_options(q):
        q.add_argument("--model", default=None,
                       help="an EEND model file, as normlab diarize train writes, or the name of one shipped with "
                       "normlab: eend_local4 (synthesizer voices, 4 local speakers), eend_pre_ln (2 local speakers) "
                       "(default: the shipped eend_real)")
        q.add_argument("--embedding", default=None, metavar="WEIGHTS",
                       help="a weight file of the encoder --speaker-encoder names (default: the weights shipped "
                       "with normlab, CAM++'s or GE2E's)")
        q.add_argument("--speaker-encoder", choices=["ge2e", "campplus"], default=None,
                       help="the speaker embeddings: ge2e (Resemblyzer's GE2E) or campplus (3D-Speaker's CAM++), "
                       "each with the settings chosen for it on the model's dev set (default: the model file's "
                       "choice)")
        q.add_argument("--num-speakers", type=positive_int, default=None,
                       help="the recording's exact speaker count, if known (default: found by clustering)")
        q.add_argument("--min-speakers", type=positive_int, default=None,
                       help="at least this many speakers (default: no bound)")
        q.add_argument("--max-speakers", type=positive_int, default=None,
                       help="at most this many speakers (default: no bound)")
        q.add_argument("--threshold", type=float, default=None,
                       help="speaker activity threshold (default: the model's)")
        q.add_argument("--overlap-threshold", type=float, default=None,
                       help="eend mode: a second speaker at the same time counts above this; higher calls "
                       "less overlap (default: the model's, else --threshold)")
        q.add_argument("--offset-threshold", type=_unit, default=None,
                       help="a speaker's turn holds on through frames where nobody talks while its probability "
                       "stays above this (hysteresis); 1 turns this off (default: the model file's, else 0.15)")
        q.add_argument("--whiten", action=argparse.BooleanOptionalAction, default=None,
                       help="cluster the speaker embeddings mapped by the model file's whitening (normlab "
                       "diarize whiten) or not (default: the model file's choice)")
        q.add_argument("--clustering", choices=["ahc", "vbx"], default=None,
                       help="ahc: the speakers are the tree's clusters at the cut; vbx: the cut starts variational "
                       "Bayes under the model file's PLDA model, which decides the count (default: the model "
                       "file's choice)")
        q.add_argument("--reassign", action=argparse.BooleanOptionalAction, default=None,
                       help="ahc: last, each piece moves to the speaker whose centroid it is nearest; "
                       "--no-reassign keeps the tree's labels (default: the model file's, else on)")
        q.add_argument("--flat-db", type=_db, default=None,
                       help="frames whose level above 300 Hz varies less than this many dB over the 2 s around "
                       "them (steady noise, hum) are never speech; 0 turns this off (default: the model file's, "
                       "else 2)")
        q.add_argument("--fill-gap", type=_gap, default=None,
                       help="a speaker's pauses shorter than this many seconds are filled (default: the model "
                       "file's, else 0: none)")
        q.add_argument("--median", type=_odd, default=None,
                       help="median filter width in frames, odd (default: the model's)")
        q.add_argument("--local-speakers", choices=["speech", "eend"], default=None,
                       help="speech: the model's speech in pieces, each piece's speaker from its embedding, one "
                       "speaker at a time; eend: the model's own local speakers, overlap kept (default: the one "
                       "chosen on the model's dev set, stored in its file)")
        q.add_argument("--vad", choices=["gate", "speech", "union", "veto", "off"], default=None,
                       help="Silero VAD: gate silences what it calls non-speech; speech: it alone "
                       "decides speech (with --local-speakers speech, the default then); union: speech where "
                       "the model or the VAD hears it; veto: silence where it hears no speech for 3 s or more; "
                       "off: the model decides (default: the model file's, else gate)")
        q.add_argument("--device", type=check_spec, default="cpu",
                       help=f"where the segmentation model runs: {DEVICE_HELP} {d}")

    rn = dsub.add_parser("run", help="write OUT/<stem>.rttm for each audio file (also: normlab diarize AUDIO...)")
    rn.add_argument("audio", nargs="+", type=a_path, help="WAV/FLAC files, any sample rate and channel count")
    rn.add_argument("--out", type=a_folder, default="rttm", help=f"output folder {d}")
    rn.add_argument("--format", choices=["rttm", "json"], default="rttm",
                    help="rttm: OUT/<stem>.rttm; json: OUT/<stem>.json with the turns (uri, start, end, speaker), "
                    f"the settings and the models' provenance {d}")
    flag(rn, "--exclusive", "one speaker at a time (overlap goes to the speaker already talking), for aligning "
         "with a transcript")
    flag(rn, "--plot", "also draw OUT/<stem>.png: speakers as rows over time, overlap marked (needs normlab[plot])")
    flag(rn, OVERWRITE, OVERWRITE_HELP)
    pipeline_options(rn)
    rn.set_defaults(func=_cmd_diarize_run)

    ev = dsub.add_parser("evaluate", help="diarize a folder of audio and print per-file and total DER "
                         "at collars 0 and 0.25 (as `diarize score` on the written RTTMs)")
    ev.add_argument("wav_dir", type=a_path,
                    help="folder of audio files (.wav, .flac, .ogg, .opus, .mp3, .aiff, .gsm); each file's stem is "
                    "its uri")
    ev.add_argument("ref", type=a_path, help="reference RTTM file")
    ev.add_argument("--uem", type=a_path, default=None, help="UEM file: score only these regions (default: per "
                    "recording, from the first turn to the last, of reference and hypothesis)")
    ev.add_argument("--out", type=a_folder, default="rttm", help=f"where the hypothesis RTTMs are written {d}")
    flag(ev, "--json", "print the numbers as JSON")
    ev.add_argument("--html", type=a_path, default=None, metavar="DIR",
                    help="also write DIR/index.html: the DER table and each file's reference and hypothesis "
                    "timelines with missed speech, false alarm and confusion marked (default: no page)")
    flag(ev, OVERWRITE, OVERWRITE_HELP)
    pipeline_options(ev)
    ev.set_defaults(func=_cmd_diarize_evaluate)

    tu = dsub.add_parser("tune", help="choose the pipeline's settings on a dev set (every file together), score "
                         "held-out sets once with the choice")
    tu.add_argument("--dev", required=True, help="comma-separated dev folders: wav/*.wav (or *.wav) and ref.rttm "
                    "(required)")
    tu.add_argument("--test", action="append", default=[], metavar="[NAME=]DIR[,DIR]",
                    help="a held-out set, scored once with the dev choice (repeatable; default: none)")
    tu.add_argument("--model", default=None, help="EEND model file, or a shipped model's name (default: the "
                    "shipped eend_real)")
    tu.add_argument("--embedding", default=None, metavar="WEIGHTS",
                    help="speaker encoder weights (default: the shipped GE2E weights)")
    tu.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                    help="replace one axis of the grid (repeatable), e.g. --grid vad=off,gate (default: the full "
                    "grid, docs/diarization.md)")
    tu.add_argument("--jobs", type=jobs, default=1, help=f"processes segmenting files in parallel {d}")
    tu.add_argument("--out", default="tune.json", help=f"the grid, the choice and the test scores {d}")
    flag(tu, "--save", "store the choice in the --model file (the pipeline's defaults for it)")
    flag(tu, OVERWRITE, OVERWRITE_HELP)
    tu.set_defaults(func=_cmd_diarize_tune, resumes=True)

    wh = dsub.add_parser("whiten", help="fit the speaker embeddings' whitening and PLDA model (--clustering "
                         "vbx) on training conversations and store them in a model file")
    wh.add_argument("model", type=a_path,
                    help="EEND model file to store it in (a copy: the shipped model is read-only)")
    wh.add_argument("--train", nargs="+", action="extend", required=True, metavar="DIR",
                    help="training folders: wav/*.wav and ref.rttm, never dev or test recordings (required)")
    wh.add_argument("--lam", type=_rate, default=1.0, help=f"shrinkage towards the identity {d}")
    wh.add_argument("--per-folder", type=positive_int, default=None,
                    help="at most this many recordings of each folder, by name (default: all)")
    wh.add_argument("--embedding", default=None, metavar="WEIGHTS",
                    help="speaker encoder weights (default: the shipped GE2E weights)")
    wh.add_argument("--jobs", type=jobs, default=1, help=f"processes segmenting files in parallel {d}")
    wh.set_defaults(func=_cmd_diarize_whiten)

    rc = dsub.add_parser("recipe", help="simulate, train, tune on dev, score on test: the shipped model's recipe",
                         formatter_class=HelpFormatter)
    rc.add_argument("--out", required=True, type=a_folder,
                    help="writes OUT/model.pt, OUT/results.json (re-running resumes; required)")
    rc.add_argument("--data", default=None, type=a_path, help="folder for the simulated splits (default: OUT/data)")
    rc.add_argument("--threads", type=threads, default=2, help=f"torch threads per process {d}")
    rc.add_argument("--jobs", type=jobs, default=2,
                    help=f"worker processes: the simulation, then the whitening's and the tuning's segmentation {d}")
    flag(rc, OVERWRITE, OVERWRITE_HELP)
    add_recipe_options(rc, {"norm": list(NORMS), "placement": list(PLACEMENTS), "encoder": ENCODERS, "head": HEADS,
                            "decay": ["none", "cosine"]})
    rc.set_defaults(func=_cmd_diarize_recipe, resumes=True)
