"""One vocabulary for every command: each option of every parser (cli/*.py) has help that states its default, on/off
options are ``--x/--no-x``, one concept has one spelling in every command, ``--device`` defaults alike, the
Python keywords are the CLI's names, and the old spellings stop with a line naming the new ones."""
import argparse
import dataclasses
import inspect
import re

import pytest

from normlab.cli import GROUPS, build_parser, main
from normlab.cli._common import Renamed

#: concept -> (the one spelling, a pattern that finds the concept in an option's help, spellings it must not use)
CONCEPTS = {
    "layer count": ("--n-layers", r"\bencoder layers\b", ("--layers", "--num-layers", "--nlayers", "--depth")),
    "speaker count of a model or mixture": ("--n-speakers", r"\bspeaker outputs\b|\bspeakers per mixture\b",
                                            ("--speakers", "--nspeakers", "--num-spk")),
    "mixture count": ("--n-mixtures", r"\bmixtures to simulate\b", ("--n", "--mixtures", "--num-mixtures")),
    "worker processes": ("--jobs", r"^(simulation )?worker processes\b",
                         ("--workers", "--processes", "--num-workers", "--procs")),
    "torch threads": ("--threads", r"^torch threads\b", ("--num-threads", "--nthreads", "--intra-op")),
    "device": ("--device", r"\bcuda:N\b", ("--gpu", "--cuda", "--devices")),
    "speaker encoder weights": ("--embedding", r"\bspeaker encoder weights\b",
                                ("--encoder-weights", "--embedder", "--embedding-weights")),
    # which encoder (GE2E or CAM++) embeds the pieces: its weights are --embedding's
    "speaker encoder choice": ("--speaker-encoder", r"^the speaker embeddings: ge2e",
                               ("--embedder-kind", "--embeddings", "--speaker-model")),
    "output folder": ("--out", r"^output folder\b", ("--output", "--outdir", "--out-dir", "--output-dir")),
    "random seed": ("--seed", r"\brandom seed\b", ("--random-seed", "--rng-seed")),
}


def _parsers():
    """``(prog, parser)`` for every command and subcommand, each group's parser built in full."""
    out = []

    def walk(p):
        out.append((p.prog, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in dict.fromkeys(a.choices.values()):
                    walk(sp)

    for command in GROUPS:
        root = build_parser(command)
        sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
        walk(sub.choices[command])
    return out


def _options(p):
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction,
                                                         argparse._SubParsersAction, Renamed))]


PARSERS = _parsers()


def test_every_command_is_walked():
    progs = {prog.split(" ", 1)[1] for prog, _ in PARSERS}
    assert {"lesson", "count", "bench", "report", "study", "diarize run", "diarize evaluate", "diarize score",
            "diarize simulate", "diarize train", "diarize recipe"} <= progs


def test_every_option_has_help_that_states_its_default():
    missing = []
    for prog, p in PARSERS:
        for a in _options(p):
            text = (a.help or "").strip()
            if not text or text == argparse.SUPPRESS or not re.sub(r"\(default: %\(default\)s\)", "", text).strip():
                missing.append(f"{prog} {a.dest}: no help")
            elif a.option_strings and not a.required and "default" not in text and "--no-" not in text:
                missing.append(f"{prog} {a.option_strings[0]}: help does not state the default")
            elif a.option_strings and a.required and "required" not in text:
                missing.append(f"{prog} {a.option_strings[0]}: help does not say it is required")
    assert not missing, "\n".join(missing)


def test_on_off_options_are_x_and_no_x():
    plain = [f"{prog} {a.option_strings[0]}" for prog, p in PARSERS for a in _options(p)
             if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))]
    assert not plain, plain


def test_one_concept_one_spelling():
    wrong = []
    for prog, p in PARSERS:
        names = {s for a in _options(p) for s in a.option_strings}
        for concept, (spelling, pattern, banned) in CONCEPTS.items():
            wrong += [f"{prog}: {b} for {concept} (use {spelling})" for b in banned if b in names]
            for a in _options(p):
                if a.option_strings and re.search(pattern, a.help or "") and spelling not in a.option_strings:
                    wrong.append(f"{prog}: {a.option_strings[0]} is {concept} (use {spelling})")
    assert not wrong, "\n".join(wrong)


def test_device_defaults_to_cpu_everywhere():
    """cpu: the device every number in the docs was measured on; auto and cuda take a GPU when asked."""
    defaults = {prog: a.default for prog, p in PARSERS for a in _options(p) if "--device" in a.option_strings}
    assert len(defaults) >= 5 and set(defaults.values()) == {"cpu"}, defaults


def test_python_keywords_are_the_cli_names():
    """Every `diarize run` option is a keyword of diarize_files (or a pipeline setting), under the same name."""
    from normlab.diarization import diarize, diarize_files
    from normlab.diarization.pipeline.config import PipelineConfig

    # the only differences, each for a reason: where the model runs is set on the model object; --out and the
    # positional files are diarize_files' first arguments; --local-speakers is PipelineConfig.speakers
    elsewhere = {"device": None, "out": "out_dir", "audio": "paths", "local_speakers": "speakers"}
    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    keywords = set(inspect.signature(diarize_files).parameters) | fields
    run = dict(PARSERS)["normlab diarize run"]
    for a in _options(run):
        name = elsewhere.get(a.dest, a.dest)
        assert name is None or name in keywords, a.dest
    params = inspect.signature(diarize).parameters
    assert "embedding" in params and "encoder" not in params


def test_recipe_options_explain_every_field():
    from normlab.cli.recipe_options import HELP
    from normlab.diarization.training.recipe import RecipeConfig

    fields = [f.name for f in dataclasses.fields(RecipeConfig)]
    assert [f for f in fields if not HELP.get(f)] == []
    recipe = dict(PARSERS)["normlab diarize recipe"]
    augment = next(a for a in recipe._actions if "--augment" in a.option_strings)
    assert isinstance(augment, argparse.BooleanOptionalAction) and "--no-augment" in augment.option_strings
    for argv, on in ((["--augment", "--out", "o"], True), (["--out", "o", "--no-augment"], False)):
        assert recipe.parse_args(argv).augment is on
    text = recipe.format_help()  # the switch it is, not "--augment [AUGMENT]"; no empty "(default: )"
    assert "--augment, --no-augment\n" in text and "AUGMENT" not in text and "(default: )" not in text


@pytest.mark.parametrize("argv, new", [
    (["diarize", "train", "--data", "d", "--out", "o", "--layers", "2"], "--n-layers"),
    (["diarize", "train", "--data", "d", "--out", "o", "--speakers", "3"], "--n-speakers"),
    (["diarize", "simulate", "--out", "o", "--n", "3"], "--n-mixtures"),
    (["diarize", "simulate", "--out", "o", "--speakers", "3"], "--n-speakers"),
    (["diarize", "recipe", "--out", "o", "--speakers", "3"], None),  # never a recipe option: argparse's own error
    (["diarize", "recipe", "--out", "o", "--augment", "0"], "--augment or --no-augment"),  # was --augment 0|1
    (["diarize", "recipe", "--augment", "1", "--out", "o"], "--augment or --no-augment"),
])
def test_old_spellings_stop_with_the_new_name(argv, new, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and (f"is now {new}" in err if new else "unrecognized" in err), err


def test_the_old_python_keyword_names_the_new_one():
    from normlab.diarization import diarize

    with pytest.raises(TypeError, match="encoder= is now embedding="):
        diarize("a.wav", encoder="w.pt")
