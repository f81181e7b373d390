"""Powerset output (Plaquet & Bredin 2023): one softmax over the sets of local speakers that can talk at once.

A multi-label head gives one independent sigmoid per local speaker; a
powerset head with ``S`` speakers and at most ``k`` of them at once gives one
class per set of at most ``k`` speakers (the empty set, the ``S`` singles,
the ``S(S-1)/2`` pairs for ``k = 2``...) and a softmax over those classes, so
"two people talk" is a class of its own rather than two thresholds that
happen to agree. The rest of normlab reads speaker probabilities: a powerset
model's are the marginals, P(speaker s talks) = the summed probability of
the classes that contain s.
"""
from __future__ import annotations

import itertools
import math

import torch


def n_classes(n_speakers: int, max_active: int) -> int:
    """Sets of at most ``max_active`` of ``n_speakers`` speakers, the empty set included."""
    return sum(math.comb(n_speakers, i) for i in range(min(max_active, n_speakers) + 1))


def subsets(n_speakers: int, max_active: int) -> torch.Tensor:
    """``(classes, speakers)`` 0/1 float on the CPU: class c's speakers; by size, then in lexicographic order."""
    rows = [c for i in range(min(max_active, n_speakers) + 1) for c in itertools.combinations(range(n_speakers), i)]
    table = torch.zeros(len(rows), n_speakers, device="cpu")  # on the CPU under any default device too
    for c, members in enumerate(rows):
        table[c, list(members)] = 1.0
    return table


def marginals(logits: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Speaker probabilities ``(..., speakers)`` from class logits ``(..., classes)``."""
    return torch.softmax(logits.float(), dim=-1) @ table.to(logits.device)


def classes_of(labels: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The class of each frame's speaker set, ``labels (..., speakers) {0, 1} -> (...) long``; -1 where more
    speakers talk than the head can say (such frames are left out of the loss)."""
    s = table.shape[1]
    weights = 2 ** torch.arange(s, device=labels.device)
    codes = (labels.long() * weights).sum(-1)  # ...: each set as a bit mask
    lookup = torch.full((2**s,), -1, dtype=torch.long, device=labels.device)
    lookup[(table.long().to(labels.device) * weights).sum(-1)] = torch.arange(table.shape[0], device=labels.device)
    return lookup[codes]
