"""Permutation-invariant losses: binary cross-entropy (EEND's multi-label head) and powerset cross-entropy."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from ..._checks import BadType, BadValue, check_padding_mask
from ...kernels.dispatch import values_known
from ..models.powerset import classes_of
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
    check_batch(logits, labels, mask)
    b, t, s = logits.shape
    valid = torch.ones(b, t, dtype=logits.dtype, device=logits.device) if mask is None else (~mask).to(logits.dtype)
    n = valid.sum(1).clamp_min(1)  # B
    table = permutations(s, device=logits.device)  # P, S
    losses = []
    for p in table.tolist():
        bce = TF.binary_cross_entropy_with_logits(logits, labels[..., p].to(logits.dtype), reduction="none")
        losses.append((bce.mean(-1) * valid).sum(1) / n)  # B
    return _best(losses, table)


def check_batch(logits, labels, mask) -> None:
    """One line for what a loss cannot take (torch's errors, a tuple unpacking's, or a loss of labels of 2)."""
    for t, name in ((logits, "logits"), (labels, "labels")):
        if not (isinstance(t, torch.Tensor) and t.dim() == 3):
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise BadValue(f"{name} must be a tensor (batch, frames, speakers), got {got}")
    if logits.shape != labels.shape:
        raise BadValue(f"logits {list(logits.shape)} and labels {list(labels.shape)} differ in shape")
    if not logits.dtype.is_floating_point:
        raise BadType(f"logits must be floating point, got {logits.dtype}")
    if values_known(labels) and bool(((labels != 0) & (labels != 1)).any()):
        raise BadValue("labels must be 0 or 1 (a speaker silent or talking in a frame)")
    check_padding_mask(mask, logits)  # (batch, frames), bool, on the logits' device


def _best(losses: list[torch.Tensor], table: torch.Tensor):
    """Per sequence the cheapest of the permutations' losses (one ``(B,)`` tensor per row of ``table``), averaged
    over the batch, and that permutation of each sequence."""
    stacked = torch.stack(losses, dim=1)  # B, P
    idx = best_per_sequence(stacked)  # B: each sequence its own label order
    return stacked.gather(1, idx[:, None]).squeeze(1).mean(), table[idx]


def pit_powerset(logits: torch.Tensor, labels: torch.Tensor, table: torch.Tensor, mask: torch.Tensor | None = None):
    """Minimum over speaker permutations of the mean frame cross-entropy of the powerset classes, per sequence,
    averaged over the batch (Plaquet & Bredin 2023).

    Parameters
    ----------
    logits : (batch, frames, classes) float
    labels : (batch, frames, speakers) {0, 1}
    table : (classes, speakers), ``powerset.subsets``
    mask : (batch, frames) bool, True = padded frame (ignored), or None

    Frames where more speakers talk than a class holds are left out. Returns the loss and, per sequence, the
    label column assigned to each output speaker, as ``pit_bce``.
    """
    b, t, c = logits.shape
    if labels.shape[:2] != (b, t) or table.shape != (c, labels.shape[2]):
        raise ValueError(f"logits {list(logits.shape)}, labels {list(labels.shape)} and the powerset table "
                         f"{list(table.shape)} do not fit together")
    valid = torch.ones(b, t, dtype=torch.bool, device=logits.device) if mask is None else ~mask
    perms = permutations(labels.shape[2], device=logits.device)  # P, S
    flat = logits.reshape(b * t, c)
    losses = []
    for p in perms.tolist():
        cls = classes_of(labels[..., p], table)  # B, T
        keep = (valid & (cls >= 0)).to(logits.dtype)
        ce = TF.cross_entropy(flat, cls.clamp_min(0).reshape(-1), reduction="none").reshape(b, t)
        losses.append((ce * keep).sum(1) / keep.sum(1).clamp_min(1))  # B
    return _best(losses, perms)


def pit_loss(model, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None):
    """The permutation-invariant loss of ``model``'s head (``EENDModel.cfg.head``)."""
    if getattr(getattr(model, "cfg", None), "head", "multilabel") == "powerset":
        return pit_powerset(logits, labels, model.powerset, mask)
    return pit_bce(logits, labels, mask)
