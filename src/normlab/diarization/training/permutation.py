"""Speaker permutations: EEND's speaker order is arbitrary, so every comparison first finds the best order.

One utility for the two places that need it:

* training (``pit.py``): the permutation-invariant loss takes, **per sequence**,
  the label order with the lowest loss (``best_per_sequence``);
* the model on a whole recording (``metrics.evaluate.frame_probs``):
  consecutive chunks of one recording come out in different speaker orders;
  each chunk is put in the order that agrees best with what is already
  decided on their overlap (``align``).
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch


@lru_cache(maxsize=16)
def _perms(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(itertools.permutations(range(n)))


def permutations(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Every order of ``n`` speakers, ``(n!, n)`` long, the identity first."""
    if n < 1:
        raise ValueError(f"need at least one speaker, got {n}")
    return torch.tensor(_perms(n), dtype=torch.long, device=device)


def best_per_sequence(costs: torch.Tensor) -> torch.Tensor:
    """Index of the cheapest permutation of each sequence.

    Parameters
    ----------
    costs : (batch, permutations) float, the cost of each permutation for each sequence

    Returns
    -------
    (batch,) long; ties go to the earlier permutation. Sequences never share a choice.
    """
    if costs.dim() != 2:
        raise ValueError(f"costs must be (batch, permutations), got shape {list(costs.shape)}")
    return costs.argmin(dim=1)


def match(reference: torch.Tensor, hypothesis: torch.Tensor) -> list[int]:
    """The hypothesis column to put under each reference column so that they agree best.

    Parameters
    ----------
    reference : (frames, speakers) activities or probabilities already decided
    hypothesis : (frames, speakers) the same frames, in an unknown speaker order

    Returns
    -------
    ``order`` with ``hypothesis[:, order]`` aligned to ``reference``: the permutation
    with the smallest total absolute difference (Hungarian algorithm; exact, any speaker count).
    """
    from scipy.optimize import linear_sum_assignment

    if reference.shape != hypothesis.shape:
        raise ValueError(f"reference {list(reference.shape)} and hypothesis {list(hypothesis.shape)} differ in shape")
    s = reference.shape[1]
    if reference.shape[0] == 0:
        return list(range(s))
    cost = (reference[:, :, None] - hypothesis[:, None, :]).abs().sum(0)  # S_ref, S_hyp
    rows, cols = linear_sum_assignment(cost.double().cpu().numpy())
    order = [0] * s
    for r, c in zip(rows.tolist(), cols.tolist()):
        order[r] = c
    return order


def align(reference: torch.Tensor, hypothesis: torch.Tensor, overlap: int) -> torch.Tensor:
    """``hypothesis`` (all its frames) in the speaker order that best matches ``reference`` on the first
    ``overlap`` frames of ``hypothesis``, which are the last ``overlap`` frames of ``reference``."""
    if overlap <= 0:
        return hypothesis
    order = match(reference[-overlap:], hypothesis[:overlap])
    return hypothesis[:, order]
