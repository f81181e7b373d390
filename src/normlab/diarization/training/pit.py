"""Permutation-invariant binary cross-entropy (EEND's training loss)."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .permutation import best_per_sequence, permutations


def pit_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None):
    """Minimum over speaker permutations of the mean frame BCE, per sequence, averaged over the batch.

    Parameters
    ----------
    logits : (batch, frames, speakers) float
    labels : (batch, frames, speakers) {0, 1}
    mask : (batch, frames) bool, True = padded frame (ignored), or None

    Returns
    -------
    loss : scalar tensor
    perms : (batch, speakers) long, the label column assigned to each output
    """
    if logits.shape != labels.shape:
        raise ValueError(f"logits {list(logits.shape)} and labels {list(labels.shape)} differ in shape")
    b, t, s = logits.shape
    valid = torch.ones(b, t, dtype=logits.dtype, device=logits.device) if mask is None else (~mask).to(logits.dtype)
    n = valid.sum(1).clamp_min(1)  # B
    table = permutations(s, device=logits.device)  # P, S
    losses = []
    for p in table.tolist():
        bce = TF.binary_cross_entropy_with_logits(logits, labels[..., p].to(logits.dtype), reduction="none")
        losses.append((bce.mean(-1) * valid).sum(1) / n)  # B
    stacked = torch.stack(losses, dim=1)  # B, P
    idx = best_per_sequence(stacked)  # B: each sequence its own label order
    best = stacked.gather(1, idx[:, None]).squeeze(1)  # B
    return best.mean(), table[idx]
