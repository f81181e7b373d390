"""Training loop for :class:`EENDModel`: PIT loss, warmup, clipping, checkpoints, resume after a kill.

Also data-parallel (``normlab.distributed``): under a process group every
rank trains on its share of each global batch with DDP, only rank 0 writes
the checkpoint and ``metrics.csv``, and a checkpoint resumes with any number
of processes.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import pathlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ... import provenance, tracking, written
from ..._checks import BadValue, Unavailable, UserError, check_count
from ...distributed import every_rank, first_line, mean_over_ranks, peer_failure, shard, world
from ...locks import folder_lock
from .pit import pit_loss

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # feats (B,T,F), labels (B,T,S), pad mask (B,T)


#: the largest learning rate accepted (``--lr`` and its kin): far beyond any that trains, and below the one where
#: Adam's float32 state overflows to an error instead of a diverged run
MAX_LR = 1e3


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000  # optimizer steps in total (a resumed run continues to this)
    lr: float = 1e-3  # peak learning rate (Adam 0.9, 0.98)
    warmup: int = 200  # linear warmup steps
    clip: float = 5.0  # gradient-norm clip
    ckpt_every: int = 100  # steps between checkpoints
    seed: int = 0  # seeds the batch generator and dropout
    decay: str = "none"  # after warmup: "none" (constant) or "cosine" (to 5% of lr at the last step)
    restart_at: int = 0  # cosine only: the first cycle ends (at 5% of lr) here and a second one starts ...
    restart_lr: float = 3e-4  # ... at this peak (after a warmup of warmup // 4 steps), down to 5% of lr at the end

    def __post_init__(self):
        # the CLI's options are checked as they are parsed; these are the same limits for the Python API
        for name, least in (("steps", 1), ("ckpt_every", 1), ("warmup", 0), ("restart_at", 0)):
            check_count(getattr(self, name), name, least=least)
        for name in ("lr", "restart_lr"):  # the CLI's bound: beyond it Adam's float32 state overflows (a traceback)
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and 0 < v <= MAX_LR):
                raise BadValue(f"{name} must be a number in (0, {MAX_LR:g}], got {v!r}")
        if not (isinstance(self.clip, numbers.Real) and 0 < self.clip < math.inf):
            raise BadValue(f"clip must be a finite number > 0, got {self.clip!r}")
        if self.decay not in ("none", "cosine"):
            raise BadValue(f"decay must be 'none' or 'cosine', got {self.decay!r}")
        if self.restart_at and not (self.decay == "cosine" and self.warmup < self.restart_at < self.steps):
            raise BadValue(f"restart_at needs decay='cosine' and warmup < restart_at < steps, got "
                           f"restart_at={self.restart_at}, warmup={self.warmup}, steps={self.steps}")
        if self.warmup >= self.steps:
            warnings.warn(f"warmup ({self.warmup} steps) is not shorter than the run ({self.steps} steps): the "
                          f"learning rate never reaches its peak {self.lr:g}", UserWarning, stacklevel=3)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        floor = 0.05 * self.lr
        if self.restart_at and step >= self.restart_at:  # the second cycle: warm up again, then down to the floor
            warmup, into = max(self.warmup // 4, 1), step - self.restart_at
            if into < warmup:
                return floor + (self.restart_lr - floor) * (into + 1) / warmup
            frac = (into - warmup) / max(self.steps - self.restart_at - warmup, 1)
            return floor + (self.restart_lr - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        warm = min(1.0, (step + 1) / max(self.warmup, 1))
        if self.decay == "none" or step < self.warmup:
            return self.lr * warm
        end = self.restart_at or self.steps
        frac = (step - self.warmup) / max(end - self.warmup, 1)
        return self.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def read_checkpoint(path: pathlib.Path) -> dict:
    """A training checkpoint (on the CPU: RNG states must stay there); one clear error where the file is not
    one (truncated by a full disk, or another file in its place), and the user decides what to do with it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # unpickling errors have many types; the file, not normlab, is at fault
        raise BadValue(f"{path} is not a readable training checkpoint ({type(e).__name__}): move it away to "
                       "start over, or give another --out") from None
    if not isinstance(state, dict) or "step" not in state:
        raise BadValue(f"{path} is not a normlab training checkpoint: move it away to start over, or give "
                       "another --out")
    if state.get("format", 1) > CHECKPOINT_FORMAT:
        raise BadValue(f"{path} was written by a newer normlab (checkpoint format {state['format']}, this one "
                       f"reads up to {CHECKPOINT_FORMAT}): resume it with that version, or give another --out")
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise BadValue(f"{path} lacks {', '.join(missing)}: not a checkpoint normlab can resume; move it away to "
                       "start over, or give another --out")
    step, losses = state["step"], state["losses"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:  # (a negative one trained at lr < 0)
        raise _damaged(path, f"its step is {step!r}, not a whole number >= 0")
    if not isinstance(losses, list) or not all(isinstance(x, numbers.Real) for x in losses):
        raise _damaged(path, "its losses are not a list of numbers")
    if len(losses) != step:  # one per step taken: the returned losses and the steps a rerun counts
        raise _damaged(path, f"it records {len(losses)} losses for its {step} steps")
    return state


def _damaged(path: pathlib.Path, why: str) -> BadValue:
    """The refusal of the checkpoint at ``path``, damaged as ``why`` says."""
    return BadValue(f"{path} is not a checkpoint normlab can resume ({why}): move it away to start over, or give "
                    "another --out")


#: what a checkpoint holds (``format`` counts changes to it; files before it had none and read as 1)
CHECKPOINT_FORMAT = 1
CHECKPOINT_KEYS = ("model", "optimizer", "step", "losses", "gen", "torch_rng")

def _save(path: pathlib.Path, state: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # this process's own: never another's half-written file
    with written.full_disk_said(path, tmp):  # a full disk reads "unexpected pos" from torch's writer
        torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill never leaves a half-written checkpoint
    for stale in path.parent.glob(f"{path.stem}.*.tmp"):  # what a process killed inside its write left
        pid = stale.name.split(".")[-2]
        if pid.isdigit() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _config_diff(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """``key: saved -> now`` for every setting that differs (nested dicts flattened)."""
    out = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def train(model: torch.nn.Module, batches: Callable[[torch.Generator], Batch], cfg: TrainConfig,
          ckpt_dir: str | pathlib.Path, progress: Callable[[int, int, float], None] | None = None, *,
          config: dict | None = None, tensorboard: str | pathlib.Path | None = None) -> list[float]:
    """Train ``model`` in place (on the device of its parameters); returns the loss of every step.

    ``batches(gen)`` draws one global batch using ``gen``. ``ckpt_dir/last.pt``
    holds the model, optimizer, step, losses and both random states; if it
    exists, training resumes from it, so a run killed at any moment repeats at
    most ``ckpt_every`` steps and ends bitwise where an uninterrupted run ends.
    ``config`` (the settings a resume must share: model, data, batch, seed) is
    kept in the checkpoint with the world size and :func:`normlab.provenance.record`;
    a resume whose ``config`` differs raises ValueError naming the settings.
    ``ckpt_dir/metrics.csv`` gets one row per step (``normlab.tracking``),
    and TensorBoard scalars go to ``tensorboard`` when given.

    Under a torch.distributed process group, each rank computes the sequences
    ``rank::world`` of every global batch (DDP averages the gradients); the
    returned losses are the global batch's. Every rank returns them; rank 0
    alone writes files.
    """
    ckpt_dir = pathlib.Path(ckpt_dir)
    rank, size = world()
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    last = ckpt_dir / "last.pt"
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed)  # the global batch stream: the same on every rank
    torch.manual_seed(cfg.seed)
    step, losses, seconds, diverged = 0, [], 0.0, None
    state = read_checkpoint(last) if last.exists() else None
    if size > 1:
        _same_checkpoint(last, state, rank, size)
    if state is not None:
        if config is not None and state.get("config") is None:
            raise BadValue(f"{last} does not record the settings it was trained with (an older normlab, or the "
                           "Python API without config=): a resume cannot be checked; move it away to start over, "
                           "or give another --out")
        if config is not None and state["config"] != config:
            diff = _config_diff(state["config"], config)
            raise BadValue(f"{last} was trained with other settings ({'; '.join(diff[:3])}"
                             f"{'; ...' if len(diff) > 3 else ''}): use the same options, or another --out")
        try:  # the settings matched (or were not given): a state that does not load is a damaged file
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            gen.set_state(state["gen"])
            torch.set_rng_state(state["torch_rng"])
        except Exception as e:
            first = str(e).strip().splitlines()[0].rstrip(":") if str(e).strip() else ""
            raise _damaged(last, f"its model, optimizer or random state does not load: {type(e).__name__}: "
                                 f"{first[:160]}") from e
        if device.type == "cuda" and "cuda_rng" in state:  # the device's own stream draws the dropout masks there
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        step, losses, seconds = state["step"], state["losses"], state.get("seconds", 0.0)
        diverged = state.get("diverged")
    saved = step  # the step of the checkpoint a rerun resumes from
    net = model
    if size > 1:
        try:  # a collective (it broadcasts rank 0's weights): a peer gone here is said as one in the loop is
            net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                            else None)
        except RuntimeError as e:
            if not peer_failure(e):  # (the ranks' models differ: DDP's own words, with its trace)
                raise
            raise _peer_lost(e, rank, size, step, saved) from e
    # (rows after the checkpoint's step are a killed session's and go; a divergence's row stays)
    metrics = (tracking.MetricsLog(ckpt_dir / "metrics.csv", diverged["step"] if diverged else step, tensorboard)
               if rank == 0 else None)
    model.train()
    t0 = time.perf_counter() - seconds  # wall time of all sessions of this run, kept in the checkpoint

    def checkpoint(elapsed: float) -> dict:
        """What a resume needs, as it stands after ``step`` steps."""
        return {"format": CHECKPOINT_FORMAT, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "step": step, "losses": losses, "gen": gen.get_state(), "torch_rng": torch.get_rng_state(),
                "seconds": elapsed, "config": config, "world_size": size, "provenance": provenance.record(),
                **({"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}

    try:
        while step < cfg.steps and diverged is None:  # a diverged run is finished: its rerun reports it again
            lr = cfg.lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            if rank:  # dropout masks differ per rank, drawn from the step: a resume is bitwise on every rank
                torch.manual_seed(cfg.seed + 1_000_003 * rank + step)
            global_batch = batches(gen)
            if size > 1 and global_batch[0].shape[0] % size:
                raise BadValue(f"the batch ({global_batch[0].shape[0]} sequences) must be a multiple of the "
                                 f"number of processes ({size})")
            feats, labels, mask = (None if t is None else t.to(device) for t in shard(global_batch, rank, size))
            loss, _ = pit_loss(model, net(feats, mask), labels, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip))
            loss_value = mean_over_ranks(loss, size).item()  # every rank sees the same loss and gradient norm
            if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
                # diverged: this step is not taken, so the weights stay those of the last finite step, and the
                # run ends as a result (its checkpoint says where), not as NaN weights trained on to the end
                diverged = {"step": step + 1, "loss": loss_value, "grad_norm": grad_norm}
                if metrics is not None:
                    metrics.log(step + 1, loss_value, lr, grad_norm, time.perf_counter() - t0)
                if rank == 0:
                    _save(last, {**checkpoint(time.perf_counter() - t0), "diverged": diverged})
                break
            opt.step()
            step += 1
            losses.append(loss_value)
            elapsed = time.perf_counter() - t0
            if metrics is not None:
                metrics.log(step, losses[-1], lr, grad_norm, elapsed)
            tracking.log_step(step, losses[-1], lr, grad_norm, elapsed)
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                saved = step
                if rank == 0:
                    _save(last, checkpoint(elapsed))
            if progress and rank == 0:
                progress(step, cfg.steps, losses[-1])
    except RuntimeError as e:
        if size == 1 or isinstance(e, UserError) or not peer_failure(e):  # this rank's own error keeps its trace
            raise
        # a peer that vanished (killed, out of memory): the collective fails here; one line, not a bug
        raise _peer_lost(e, rank, size, step, saved) from e
    finally:
        if metrics is not None:
            metrics.close()
    return losses


def _same_checkpoint(last: pathlib.Path, state: dict | None, rank: int, size: int) -> None:
    """Refuse a start where the ranks found different checkpoints (or some none): each reads ``last`` on the
    machine it runs on, so with a folder of each machine's own they would train on from different steps, DDP
    averaging gradients of other batches at other learning rates into the weights rank 0 saves."""
    import torch.distributed as dist

    step = 0 if state is None else state["step"]
    mine = (None if state is None else hashlib.sha256(last.read_bytes()).hexdigest(), step)
    seen: list = [None] * size
    try:
        dist.all_gather_object(seen, mine)
    except RuntimeError as e:
        if not peer_failure(e):
            raise
        raise _peer_lost(e, rank, size, step, step) from e
    if len({digest for digest, _ in seen}) > 1:
        found = ", ".join(f"rank {r}: {f'step {s}' if d else 'none'}" for r, (d, s) in enumerate(seen))
        error = BadValue(f"the ranks found different checkpoints at {last} ({found}): each reads that folder on "
                         "its own machine; give every rank the same checkpoint (an --out that all machines share)")
        every_rank(error, mark=True)  # each rank saw the same gathered digests
        raise error


def data_digest(folders: list[pathlib.Path]) -> str:
    """SHA-256 over what training reads of each data folder: its ``config.json``, every ``wav/<name>.rttm`` (the
    labels) and every ``wav/<name>.wav``'s name and size: what a resume must train on again. (It hashed
    ``ref.rttm``, which training never reads: labels or audio changed under a checkpoint trained on, and a
    comment added to ``ref.rttm`` stopped a resume.)"""
    h = hashlib.sha256()
    for d in folders:
        h.update(b"config.json" + ((d / "config.json").read_bytes() if (d / "config.json").is_file() else b"-"))
        for f in sorted((d / "wav").glob("*.rttm")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        for f in sorted((d / "wav").glob("*.wav")):
            h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


def _made_from(model_file: pathlib.Path, last: pathlib.Path, settings: dict) -> bool:
    """Whether ``model_file`` is the model of the checkpoint ``last``: its record names that checkpoint's step and
    these training settings. A run killed after its last checkpoint and before the model was written left the
    model of an earlier session, which the rerun (no step left) kept as this one's."""
    from . import provenance as model_provenance

    try:
        meta = model_provenance.read(model_file)
        return meta.get("steps") == read_checkpoint(last)["step"] and meta.get("training") == settings
    except Exception:  # noqa: BLE001   (absent, damaged, not a model: written again)
        return False


def _stored_since(model_file: pathlib.Path) -> list[str]:
    """What was stored in a trained ``model_file`` after its training (``diarize tune --save``'s settings,
    ``diarize whiten``'s whitening): a rewrite of the file drops it."""
    try:
        blob = torch.load(model_file, map_location="cpu", weights_only=True)
        post = blob.get("postprocess") or {}
        return [what for what, there in (("the pipeline settings of `diarize tune --save`", post.get("modes")),
                                         ("the whitening of `diarize whiten`", blob.get("whitening"))) if there]
    except Exception:  # noqa: BLE001   (absent, damaged, not a model: nothing of the user's to lose in it)
        return []


def _peer_lost(e: RuntimeError, rank: int, size: int, step: int, saved: int) -> Exception:
    """One line for a collective that failed because another rank vanished (killed, out of memory)."""
    return Unavailable(f"rank {rank} of {size} stopped at step {step + 1}: {first_line(e)} (a rank that "
                       "died is named by the launcher); run the same command again to resume from "
                       + (f"the checkpoint at step {saved}" if saved else "the start"))


def run_lock(folder: pathlib.Path):
    """Hold ``folder/.normlab.lock`` for the block: a second training into the same folder stops with one line
    instead of training beside the first (the two replaced each other's checkpoints)."""
    return folder_lock(folder, "trained", "wait for it to finish (or stop it), or give another --out",
                       shown=folder.parent)


def batch_statistics(model: torch.nn.Module) -> list[str]:
    """The kinds of layer in ``model`` whose training output depends on the batch (batch norms): each process
    of a data-parallel run normalizes over its own part of the batch."""
    from ...batchnorm import MaskedBatchNorm

    kinds = (torch.nn.modules.batchnorm._BatchNorm, MaskedBatchNorm)
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, kinds)})


def _memory_bytes() -> int | None:
    """This machine's memory (None where it cannot be asked: no sysconf, as on Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_model_fits(cfg) -> None:
    """BadValue (one line) where an EEND model of ``cfg`` (a ``ModelConfig``) cannot be trained in this machine's
    memory: its weights, their gradients and Adam's two moments (float32) alone are more than there is. 100,000
    layers were built one by one while the memory climbed, without a word."""
    total = _memory_bytes()
    if total is None:
        return
    d, ff = cfg.d_model, cfg.d_ff
    weights = cfg.input_dim * d + cfg.n_layers * (4 * d * d + 2 * d * ff)  # the input projection and each layer's
    need = 4 * 4 * weights  # attention and feed-forward matrices: the bulk
    if need > total:
        raise BadValue(f"a model of {cfg.n_layers:,} layers of width {d} (feed-forward {ff}) needs at least "
                       f"{need / 2**30:,.0f} GiB to train (weights, gradients, Adam's moments), more than this "
                       f"machine's {total / 2**30:.0f} GiB: use fewer or narrower layers")


def check_batch_fits(batch: int, frames: int, input_dim: int, n_heads: int) -> None:
    """BadValue (one line) where a batch cannot fit in this machine's memory: its windows' features and one
    layer's attention weights alone (float32) are more than the memory there is. A batch of 10^8 windows was
    drawn one window at a time until the system killed the process, without a word."""
    total = _memory_bytes()
    if total is None:  # nothing to compare with
        return
    need = 4 * batch * frames * (input_dim + n_heads * frames)
    if need > total:
        raise BadValue(f"a batch of {batch} windows of {frames} frames needs at least {need / 2**30:,.0f} GiB (its "
                       f"features and one layer's attention weights), more than this machine's {total / 2**30:.0f} "
                       "GiB: use a smaller batch or fewer frames")


def train_run(data, out: str | pathlib.Path, model_cfg, cfg: TrainConfig, *, batch: int = 8, frames: int = 500,
              device: str = "auto", tensorboard: str | pathlib.Path | None = None,
              progress: Callable[[int, int, float], None] | None = None) -> dict:
    """``normlab diarize train``: one process, or one rank of ``torchrun`` (``normlab.distributed``).

    Trains an :class:`EENDModel` of ``model_cfg`` on the simulated folders ``data``
    (``batch`` mixtures of ``frames`` frames per optimizer step, split over the
    ranks), checkpointing to ``out/ckpt`` (with ``metrics.csv``) and resuming
    from it; rank 0 writes ``out/model.pt``. Returns the losses, the world size
    and the training throughput of this session (sequences per second).
    """
    from dataclasses import asdict

    from ...devices import resolve
    from ...distributed import on_rank0, process_group
    from ..data.dataset import MixtureSet
    from ..models.eend import EENDModel
    from . import provenance as model_provenance

    check_count(batch, "batch")
    check_count(frames, "frames")
    check_model_fits(model_cfg)
    check_batch_fits(batch, frames, model_cfg.input_dim, model_cfg.n_heads)
    out = pathlib.Path(out)
    if (out / "model.pt").is_dir():  # found only when the model was moved into place, after the training
        raise BadValue(f"{out / 'model.pt'} is a folder where the model would go: move it away, or give another "
                       "--out")
    if (out / "model.pt").exists() and not (out / "ckpt" / "last.pt").exists():  # not this training's own model
        raise BadValue(f"{out / 'model.pt'} exists and {out / 'ckpt'} holds no training to resume: training from "
                       "scratch would replace it; give another --out, or move it away first")
    if tensorboard is not None:
        tracking.check_tensorboard()  # before any rank starts (one rank alone failing left the others a traceback)
    dev = resolve(device)
    folders = [pathlib.Path(d) for d in (data if isinstance(data, (list, tuple)) else [data])]
    with process_group(dev) as (rank, size), on_rank0(lambda: run_lock(out / "ckpt"), rank, size):
        if batch % size:  # before the data is read (train checks each batch it draws too)
            raise BadValue(f"the batch ({batch} sequences) must be a multiple of the number of processes ({size})")
        mixtures = MixtureSet(data, n_speakers=model_cfg.n_speakers)
        torch.manual_seed(cfg.seed)
        model = EENDModel(model_cfg).to(dev)
        model.features = mixtures.cfg
        layers = batch_statistics(model)
        if size > 1 and rank == 0 and layers:

            warnings.warn(f"this model's {', '.join(layers)} layers normalize over each process's part of the "
                          f"batch: it trains differently with the number of processes ({size} here; "
                          "docs/scaling.md)", stacklevel=2)
        # the data by where it is (however the path was written) and what it holds (simulated again into the
        # same folder, it is other data)
        sources = model_provenance.folder_sources(folders)  # before training: nothing of the data fails after it
        settings = {"model": asdict(model_cfg), "data": [os.path.abspath(d) for d in folders],
                    "data_digest": data_digest(folders), "batch": batch, "frames": frames, "seed": cfg.seed,
                    "lr": cfg.lr, "warmup": cfg.warmup, "decay": cfg.decay, "clip": cfg.clip}
        last = out / "ckpt" / "last.pt"
        start = read_checkpoint(last)["step"] if last.exists() else 0
        t0 = time.perf_counter()
        losses = train(model, mixtures.batches(batch, frames), cfg, out / "ckpt", progress if rank == 0 else None,
                       config=settings, tensorboard=tensorboard if rank == 0 else None)
        seconds = time.perf_counter() - t0
        # a rerun with no step left leaves the model file of that checkpoint as it is: what was stored in it
        # since (diarize tune --save, whiten) was erased by a rewrite
        kept = len(losses) == start and _made_from(out / "model.pt", last, settings)
        if rank == 0 and not kept:
            stored = _stored_since(out / "model.pt")
            if stored:  # for the weights before these steps: said, not dropped without a word
                warnings.warn(f"{out / 'model.pt'} now holds the model after step {len(losses)}; "
                              f"{' and '.join(stored)} stored in the one it replaces were for the weights before: "
                              "run them again", RuntimeWarning, stacklevel=2)
            tmp = out / ".model.pt.tmp"
            try:  # (a full disk said in one line: the half-written model not left beside the rest)
                model.save(tmp)
                state = read_checkpoint(last)
                model_provenance.write(tmp, {  # what made it, readable with training.provenance.read
                    "max_local_speakers": model_cfg.n_speakers, "window_frames": frames,
                    "window_seconds": round(frames * mixtures.cfg.frame_seconds, 6), "training": settings,
                    "steps": state["step"], "world_size": size, "train_seconds": round(state.get("seconds", 0.0), 1),
                    "train_sources": sources,
                    "versions": model_provenance.versions(), **({"diverged": state["diverged"]}
                                                                if state.get("diverged") else {})})
                os.replace(tmp, out / "model.pt")
            finally:
                tmp.unlink(missing_ok=True)
        if rank == 0 and kept:
            state = read_checkpoint(last)
        diverged = state.get("diverged") if rank == 0 else None  # rank 0 reports; its checkpoint says
    steps = len(losses) - start
    return {"rank": rank, "world_size": size, "device": str(dev), "losses": losses, "mixtures": len(mixtures.items),
            "steps": steps, "seconds": seconds, "samples_per_s": batch * steps / seconds if steps else 0.0,
            "diverged": diverged, "model_written": not kept}
