"""Data-parallel training with torch.distributed: ``torchrun --nproc_per_node N -m normlab diarize train ...``.

torchrun (or any launcher that sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``) starts one process per rank;
:func:`process_group` joins them with gloo on CPU or nccl on CUDA. Run alone
(no ``WORLD_SIZE``, or 1), everything is the single-process path, bitwise.

The split of the data (``shard``) is DistributedSampler's: every rank draws
the same global batch from the same seeded generator and keeps the sequences
``rank, rank + world, ...``. The global batch is therefore the same for every
world size, DDP averages the gradients over ranks, and the loss (a mean over
sequences) is the same as one process computing the whole batch, up to the
order of the floating-point sums.
"""
from __future__ import annotations

import contextlib
import datetime
import os


def world() -> tuple[int, int]:
    """``(rank, world size)``: from the process group when one is running, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched() -> bool:
    """True when a launcher started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@contextlib.contextmanager
def process_group(device, timeout_s: float = 600.0):
    """Join the ranks (gloo on CPU, nccl on CUDA) for the block; yields ``(rank, world size)``."""
    if not launched():
        yield 0, 1
        return
    import torch
    import torch.distributed as dist

    from ._checks import Unavailable

    if not dist.is_available():
        raise Unavailable("this torch build has no torch.distributed: run with one process")
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    done = False
    try:
        yield dist.get_rank(), dist.get_world_size()
        done = True
    finally:
        if done:
            # every rank finished (rank 0 writes the last checkpoint after the others stop) before any tears down
            # its connections: a rank that left while rank 0 still worked aborted once in a full test run
            dist.barrier()
        dist.destroy_process_group()


def shard(batch, rank: int, world: int):
    """Rank ``rank``'s part of a global batch: sequences ``rank::world`` of every tensor (None stays None)."""
    if world == 1:
        return batch
    return tuple(None if t is None else t[rank::world] for t in batch)


def mean_over_ranks(value, world: int):
    """The mean of a scalar tensor over the ranks (itself when alone)."""
    if world == 1:
        return value
    import torch.distributed as dist

    value = value.detach().clone()
    dist.all_reduce(value)
    return value / world
