"""``normlab diarize recipe``'s options: one per ``RecipeConfig`` field, with the field's meaning as its help.

``HELP`` says what each field does (``tests/test_cli_vocabulary.py`` checks that every field has an entry);
the default is the dataclass's. 0/1 fields that mean on/off are ``--x/--no-x``.
"""
from __future__ import annotations

import argparse
import dataclasses

from ._common import flag

HELP = {
    "n_train": "training conversations, 1-4 speakers: real people and synthesizers, perturbed",
    "n_train_real": "more training conversations of real people only, perturbed",
    "n_dev": "dev conversations (the dev split's people), for the threshold and median width",
    "n_dev_mixed": "dev conversations of 1-4 speakers (dev people and dev synthesizer voices), for the pipeline",
    "n_dev_synth": "EEND-style dev mixtures of the dev split's synthesizer voices, for the pipeline",
    "n_test_mixed": "test conversations of 1-4 speakers (test people and test synthesizer voices), scored once",
    "n_test": "test conversations (the test split's people, perturbed like train), scored once",
    "n_test_dry": "test conversations without perturbation (white noise at 10-20 dB only), scored once",
    "n_train_synth": "EEND-style training mixtures of synthesizer voices",
    "synth_from": "training step at which the synthesizer mixtures join the training data",
    "n_test_synth": "EEND-style test mixtures of the test split's synthesizer voices, scored once",
    "n_train_stretch": "training conversations with a 3-12 s pause filled with a sound that is not speech",
    "n_train_nonspeech": "training recordings of sounds alone (noise, hum, music, typing), nobody speaking",
    "n_dev_stretch": "dev conversations with a 3-12 s pause filled with a sound, for the pipeline's settings",
    "n_test_stretch": "test conversations with a 3-12 s pause filled with a sound, scored once",
    "finetune_steps": "a last training stage from the trained model on every training set (the two above "
                      "among them), this many steps",
    "finetune_lr": "the last stage's peak learning rate",
    "n_flite": "test mixtures of flite's voices, scored once",
    "n_train_reverb": "extra training mixtures, every one in a room",
    "n_test_reverb": "test mixtures in a room, scored once",
    "n_speakers": "most speakers in a mixture and in a window: the model's outputs",
    "min_speakers": "mixtures cycle through MIN..--n-speakers speakers",
    "beta": "mean silence before an utterance for 1-2 speakers, s (more speakers: EEND-EDA's scale)",
    "min_utterances": "utterances per speaker, at least",
    "max_utterances": "utterances per speaker, at most",
    "sources": "voices: real people and synthesizers (mixed), synthesizers only (all), real people (real), "
               "espeak-ng (espeak), real people and the Kokoro and Piper neural voices (neural; normlab[voices])",
    "style": "conversation: turn-taking; mixture: EEND's independent timelines",
    "real_p": "in mixed conversations, the share of speakers who are real people",
    "augment": "perturb: speaker warps and levels, rooms, noise types, telephone, gain",
    "steps": "optimizer steps",
    "lr": "peak learning rate",
    "warmup": "linear warmup steps",
    "decay": "learning rate after warmup",
    "batch": "windows per step",
    "frames": "100 ms frames per training window: the window the model is made for",
    "d_model": "encoder width",
    "n_layers": "encoder layers",
    "n_heads": "attention heads",
    "norm": "the encoder's norm",
    "placement": "where the norms go",
    "encoder": "encoder type",
    "head": "output head: multilabel (one sigmoid per speaker) or powerset (a softmax over sets of speakers)",
    "dropout": "dropout in the feed-forward hidden layer and on branch outputs",
    "seed": "random seed (data and training)",
    "restart_at": "step where a second cosine learning-rate cycle starts (ignored when --steps is not larger)",
    "restart_lr": "the second cycle's peak learning rate",
    "dev_extra": "more dev folders (wav/*.wav and ref.rttm, comma-separated) for choosing the pipeline's settings "
                 "(default: none)",
    "whiten_lam": "shrinkage of the speaker embeddings' whitening fitted after training (0: none)",
    "whiten_per_folder": "the whitening is fitted on this many conversations of train and of train_real",
    "tune_grid": "pipeline settings to try on the dev set, NAME=V1,V2 items separated by ';' (default: the full "
                 "grid); 'none' skips the pipeline tuning",
}
FLAGS = ("augment",)  # 0/1 fields that mean on/off


def add_recipe_options(parser: argparse.ArgumentParser, choices: dict[str, list]) -> None:
    from ..diarization.data.voices import SOURCES
    from ..diarization.training.recipe import RecipeConfig

    choices = {"sources": list(SOURCES), "style": ["conversation", "mixture"], **choices}
    for f in dataclasses.fields(RecipeConfig):
        name, what = f"--{f.name.replace('_', '-')}", HELP.get(f.name, "")
        if f.name in FLAGS:
            flag(parser, name, what, default=bool(f.default), was_valued=True)  # was --augment 0|1
        else:
            shown = "" if f.default == "" else " (default: %(default)s)"  # an empty default's help says it
            parser.add_argument(name, type=type(f.default), default=f.default, choices=choices.get(f.name),
                                help=what + shown)
