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
import sys
import tempfile
import threading
import time


def world() -> tuple[int, int]:
    """``(rank, world size)``: from the process group when one is running, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched() -> bool:
    """True when a launcher started this process as one of several ranks (``WORLD_SIZE`` above 1)."""
    from ._checks import env_whole

    return env_whole("WORLD_SIZE", "1", least=1) > 1


#: seconds a rank waits for the others to join (``NORMLAB_JOIN_TIMEOUT``); collectives keep ``timeout_s``
JOIN_TIMEOUT_S = 120.0

#: seconds a rank blocked in torch.distributed has, after a Ctrl-C or SIGTERM, to stop on its own
GRACE_S = 10.0


def launch_settings() -> dict:
    """``rank, world, host, port`` from the launcher's environment, checked: one line naming what is wrong (a
    launch with ``WORLD_SIZE`` but no ``RANK``, a port that is not a port) instead of torch's traceback."""
    from ._checks import BadValue, env_whole

    world_size = env_whole("WORLD_SIZE", "1", least=1)
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise BadValue(f"WORLD_SIZE={world_size} but {', '.join(missing)} not set: start the ranks with torchrun "
                       "(it sets them all), or unset WORLD_SIZE to run alone")
    rank = env_whole("RANK", most=world_size - 1)
    port = env_whole("MASTER_PORT", least=1, most=65535)
    return {"rank": rank, "world": world_size, "host": os.environ["MASTER_ADDR"], "port": port}


def _join_timeout() -> float:
    from ._checks import env_whole

    # at most a week: timedelta overflows near 1e14 s
    return float(env_whole("NORMLAB_JOIN_TIMEOUT", str(int(JOIN_TIMEOUT_S)), least=1, most=7 * 86400))


@contextlib.contextmanager
def _stderr_held():
    """What is written to file descriptor 2 inside the block (torch's C++ logging writes there, past
    ``sys.stderr``), held in a file and written out after it, unless the block sets ``held["drop"]``."""
    held = {"drop": False}
    sys.stderr.flush()
    saved = held["fd"] = os.dup(2)  # the real stderr, for a line that must be read before the block ends
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not held["drop"]:
                f.seek(0)
                data = memoryview(f.read())
                while data:
                    data = data[os.write(2, data):]


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (torch's collectives add pages of C++ context), or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


#: what a collective's failure says when another rank is gone (gloo's and NCCL's words, torch's process group)
PEER_SIGNS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "processgroup", "timed out")


def peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another rank is gone or stuck (torch's
    ``DistError`` kinds, or a RuntimeError in gloo's or NCCL's words), not this rank's own failure (a shape
    error, a bug in a layer), which keeps its traceback."""
    import torch.distributed as dist

    kind = getattr(dist, "DistError", None)  # (torch 2.1 and later)
    if isinstance(kind, type) and isinstance(error, kind):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(sign in text for sign in PEER_SIGNS)


def _give_up(fd: int, line: str) -> None:
    """The join's watchdog: ``line`` to ``fd`` (the real stderr), then exit 2 at once."""
    os.write(fd, line.encode())
    os._exit(2)


def _join(settings: dict, join_timeout: float, timeout_s: float):
    """The ranks' store as ``env://`` makes it (rank 0 serves it, or torchrun's agent does), waiting at most
    ``join_timeout`` s for every rank; then ``timeout_s`` for what the ranks do together."""
    import torch.distributed as dist
    from torch.distributed.rendezvous import rendezvous

    from ._checks import Unreachable, UserError

    rank, world_size, host, port = settings["rank"], settings["world"], settings["host"], settings["port"]
    failed = f"rank {rank} of {world_size} could not join the others at {host}:{port}"
    advice = "start every rank (torchrun sets them up), or unset WORLD_SIZE to run alone"
    with _stderr_held() as held:
        # the store's own timeout does not cover a server that accepts and never answers (another program on
        # MASTER_PORT): the rank waited there in silence for good. Past twice the join's time, one line and exit
        # 2 (the process holds nothing yet: no lock, no file)
        watchdog = threading.Timer(2 * join_timeout + 5, _give_up, (held["fd"], (
            f"normlab: {failed} (no answer in {2 * join_timeout + 5:g} s: is something else listening there?): "
            f"{advice}\n")))
        watchdog.daemon = True
        watchdog.start()
        try:
            store, _, _ = next(rendezvous("env://", timeout=datetime.timedelta(seconds=join_timeout)))
            _roll_call(store, rank, world_size, join_timeout)
        except UserError:
            held["drop"] = True
            raise
        except (RuntimeError, ValueError, OSError) as e:  # DistStoreError / DistNetworkError are RuntimeErrors
            held["drop"] = True  # the C++ store's own log of it (40 lines of stack frames): this line says it
            raise Unreachable(f"{failed} ({first_line(e)[:200]}): {advice}") from None
        finally:
            watchdog.cancel()
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    # as init_process_group keys its own store, per attempt: torchrun's agent keeps the store across restarts, and
    # a restarted rank could read a peer's address of the attempt before (gloo: "Connection reset by peer")
    return dist.PrefixStore(f"{_attempt()}/default_pg", store)


def _attempt() -> str:
    """The prefix of normlab's keys in the ranks' store for this launch: torchrun's agent keeps one store across
    its restarts (``--max-restarts``), where a restarted rank found its own roll-call entry of the attempt before
    and was refused as a second process of its rank."""
    return f"normlab/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _roll_call(store, rank: int, world_size: int, join_timeout: float) -> None:
    """Every rank of the launch present once and with one ``WORLD_SIZE``, before torch's process group: two
    processes of one ``RANK``, or ranks started with different ``WORLD_SIZE``s, waited there the collectives' ten
    minutes and ended in a traceback. The store keeps the roll, under this attempt's prefix (:func:`_attempt`)."""
    from ._checks import BadValue, Unreachable

    if store.add(f"{_attempt()}/rank{rank}", 1) > 1:
        raise BadValue(f"another process joined as rank {rank} of {world_size} already: each process needs its "
                       "own RANK from 0 to WORLD_SIZE - 1 (torchrun sets them)")
    store.set(f"{_attempt()}/world{rank}", str(world_size))
    keys = [f"{_attempt()}/world{r}" for r in range(world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=join_timeout))
    except RuntimeError:  # (DistStoreError) the wait's timeout
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:  # all came as the wait ended
            raise
        listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise Unreachable(f"rank {rank} of {world_size} waited {join_timeout:g} s for rank{'s' * (len(missing) > 1)} "
                          f"{listed}: not started, or started with another WORLD_SIZE: start every rank with one "
                          "WORLD_SIZE (torchrun sets them up), or unset WORLD_SIZE to run alone") from None
    for r, key in enumerate(keys):
        other = int(store.get(key))
        if other != world_size:
            raise BadValue(f"rank {r} was started with WORLD_SIZE={other}, rank {rank} with {world_size}: every "
                           "rank needs the same WORLD_SIZE (torchrun sets it)")


def _stops(handler) -> bool:
    """Whether a signal's Python handler stops the command: Python's KeyboardInterrupt, or the CLI's SIGTERM."""
    import signal

    return handler is signal.default_int_handler or bool(getattr(handler, "normlab_stops", False))


@contextlib.contextmanager
def _heard_while_blocked(rank: int, world_size: int, grace_s: float = GRACE_S):
    """A Ctrl-C or a SIGTERM that arrives while this rank waits inside torch.distributed's C++ (the join, or a
    collective whose peer is gone or stuck) ends the rank within ``grace_s`` seconds. Python runs a signal's
    handler only once the C++ call returns: a rank waited the join's 245 s or the collectives' ten minutes with
    the signal pending. Where the handler stops the command, a thread hears the signal (Python's wakeup file
    descriptor) and gives the main thread ``grace_s`` to stop on its own (its one line, its cleanup); past that
    it writes one line and ends the process with 128 + the signal, as the default action would. A program that
    keeps its own handlers or wakeup descriptor keeps them, unwatched."""
    import signal

    watched = {int(s) for s in (signal.SIGINT, signal.SIGTERM) if _stops(signal.getsignal(s))}
    if not watched or threading.current_thread() is not threading.main_thread():  # (only it sets the descriptor)
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # (the signal handler must never block on it)
    before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if before != -1:  # the program's own: put back
        signal.set_wakeup_fd(before)
        os.close(read_end)
        os.close(write_end)
        yield
        return
    left = threading.Event()
    stderr = os.dup(2)  # the real one: the join holds file descriptor 2 (_stderr_held)

    def hear() -> None:
        while not left.is_set():
            heard = os.read(read_end, 64)
            if not heard:  # the block ended: the write end is closed
                return
            signum = next((s for s in heard if s in watched), None)
            if signum is not None and not left.wait(grace_s):
                what = "interrupted" if signum == signal.SIGINT else "terminated"
                os.write(stderr, (f"normlab: rank {rank} of {world_size} {what} while it waited in torch.distributed "
                             f"(the others, or a collective): ended after {grace_s:g} s\n").encode())
                os._exit(128 + signum)

    listener = threading.Thread(target=hear, name="normlab-signals", daemon=True)
    listener.start()
    try:
        yield
    finally:
        left.set()
        signal.set_wakeup_fd(-1)
        os.close(write_end)
        listener.join(timeout=grace_s + 1)
        os.close(read_end)
        os.close(stderr)


@contextlib.contextmanager
def process_group(device, timeout_s: float = 600.0):
    """Join the ranks (gloo on CPU, nccl on CUDA) for the block; yields ``(rank, world size)``.

    The launcher's variables are checked first, the join waits :data:`JOIN_TIMEOUT_S` (a rank started alone
    waited ``timeout_s``, ten minutes, in silence), and a rank ends when the launcher that started it dies (a
    ``kill -9`` of torchrun left its ranks training, and a rerun trained beside them)."""
    if not launched():
        if os.environ.get("TORCHELASTIC_RUN_ID") or "LOCAL_RANK" in os.environ:  # torchrun with one process: it
            from .workers import die_with_parent  # outlived a killed launcher, lock held, and a rerun was refused

            die_with_parent()
        yield 0, 1
        return
    import torch
    import torch.distributed as dist

    from ._checks import Unavailable
    from .workers import die_with_parent

    if not dist.is_available():
        raise Unavailable("this torch build has no torch.distributed: run with one process")
    settings = launch_settings()
    die_with_parent()
    with _heard_while_blocked(settings["rank"], settings["world"]):
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(device)
        store = _join(settings, _join_timeout(), timeout_s)
        dist.init_process_group(backend, store=store, rank=settings["rank"], world_size=settings["world"],
                                timeout=datetime.timedelta(seconds=timeout_s))
        done, lost = False, None
        try:
            yield dist.get_rank(), dist.get_world_size()
            done = True
        except BaseException as e:
            # an error every rank raised at the same point (every_rank) leaves as a finished block does: rank 1 of a
            # refused start aborted in its teardown once, rank 0 and the store it served already gone
            done = every_rank(e)
            raise
        finally:
            if done:
                # every rank finished (rank 0 writes the last checkpoint after the others stop) before any tears down
                # its connections: a rank that left while rank 0 still worked aborted once in a full test run
                try:
                    dist.barrier()
                except RuntimeError as e:  # another rank stopped (killed) after its part: one line, not gloo's trace
                    lost = first_line(e)
            dist.destroy_process_group()
            if done and lost is None:
                _leave_together(store, settings["rank"], settings["world"])
        if lost is not None:
            raise Unavailable(f"rank {settings['rank']} of {settings['world']} finished its part, but another rank "
                              f"stopped before the end ({lost[:160]}; the launcher names it): run the same command "
                              "again to finish from the last checkpoint")


def every_rank(error: BaseException, mark: bool = False) -> bool:
    """Whether ``error`` was raised by every rank at the same point (each from the same gathered values, so none
    is still working); ``mark=True`` says so of it. The ranks then leave :func:`process_group` together."""
    if mark:
        error.normlab_every_rank = True
    return bool(getattr(error, "normlab_every_rank", False))


def _leave_together(store, rank: int, world_size: int, wait_s: float = 60.0) -> None:
    """Rank 0 (whose process serves the ranks' store, unless torchrun's agent does) stays until every rank has
    torn down its process group: a rank still tearing down when the store vanished aborted ("terminate called
    without an active exception")."""
    try:
        store.add(f"{_attempt()}/left", 1)
        deadline = time.monotonic() + wait_s
        while rank == 0 and store.add(f"{_attempt()}/left", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.01)
    except RuntimeError:  # the store is gone already (the agent's, after the others left): nothing to wait for
        pass


@contextlib.contextmanager
def on_rank0(enter, rank: int, world: int):
    """Hold the context ``enter()`` on rank 0 alone (a folder lock) for the block, every rank learning whether it
    could: where rank 0 stops with a user error (another run holds the lock) or an OS error (the folder cannot be
    made or locked), each other rank stops with the same line rather than at its first collective ("Connection
    closed by peer", and "run the same command again to resume", which would be refused again). Any other
    exception is a bug: rank 0 raises it as it is, the others stop naming it."""
    with contextlib.ExitStack() as stack:
        error = None
        if rank == 0:
            try:
                stack.enter_context(enter())
            except Exception as e:  # noqa: BLE001 - every rank must hear of it before any collective
                error = e
        if world > 1:
            import torch.distributed as dist

            said = [None if error is None else _as_said(error)]
            try:
                dist.broadcast_object_list(said, src=0)
            except RuntimeError as e:  # a peer gone before the first step: killed, or two processes of one RANK
                if error is not None:
                    raise error from None
                from ._checks import Unavailable

                raise Unavailable(f"rank {rank} of {world} lost the other ranks before the first step "
                                  f"({first_line(e)}): "
                                  "each process needs its own RANK from 0 to WORLD_SIZE - 1 (torchrun sets them); "
                                  "a rank that died is named by the launcher") from None
            if rank != 0 and said[0] is not None:
                kind, text = said[0]
                raise kind(f"rank 0 did not start: {text}")
        if error is not None:
            raise error
        yield


def _as_said(error: Exception) -> tuple[type, str]:
    """What the other ranks raise for rank 0's ``error``: a user error as it is; an OS error (a folder that cannot
    be made or locked) as the user error the CLI makes of it, its path and reason in one line; a bug as a
    RuntimeError naming it."""
    from ._checks import UserError, path_refused

    if isinstance(error, UserError):
        return type(error), str(error)
    if isinstance(error, OSError):
        return UserError, path_refused(error) if error.filename else str(error)
    return RuntimeError, f"{type(error).__name__}: {error}"


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
