"""Study cells as Ray tasks: ``normlab report --executor ray [--address auto|HOST:PORT]``.

The runner hands the missing cells to :meth:`RayExecutor.run`; each cell is
one task (one CPU) that imports the cell function by name on its worker, so
every node needs normlab installed. Results come back to the driver, which
alone writes the store, so resume, ``--quick``, verdicts and the HTML report
are the same as with the local executor, and a report started on Ray can be
resumed with ``--executor local`` (and the other way round) at ``--jobs`` 2 or
more: one torch thread per cell, as on Ray (the thread count is in the key).

``address``: None starts a private local Ray instance with ``jobs`` CPUs (the
same worker count as ``--jobs`` locally); ``"auto"`` joins the cluster that
``ray start`` runs on this machine; ``HOST:PORT`` joins a cluster's head node.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator

from .._checks import BadValue, MissingDependency, Unreachable

#: an HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame (RFC 9113, 3.4)
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_grpc(sock: socket.socket) -> bool:
    """Whether the server on ``sock`` answers an HTTP/2 preface with its SETTINGS frame, as the gRPC server of
    a Ray cluster's head (its GCS) does; a web server, an SSH daemon or a silent port does not."""
    sock.sendall(_HTTP2_HELLO)
    head = b""
    while len(head) < 9:  # a frame header: length (3), type (1: SETTINGS is 4), flags (1), stream (4)
        chunk = sock.recv(9 - len(head))
        if not chunk:
            return False
        head += chunk
    return head[3] == 0x04


#: the port of a Ray cluster's client server, which a ``ray://HOST`` address without one means
RAY_CLIENT_PORT = 10001


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A one-line ConnectionError when nothing listens at ``HOST:PORT`` (or at a Ray Client address
    ``ray://HOST[:PORT]``), or something that is not a Ray cluster's head does (Ray itself would retry for
    minutes, printing a warning every few seconds; a Ray Client address timed out after 30 s, the report's
    folder already made)."""
    client = address.startswith("ray://")
    where = address.removeprefix("ray://")
    if client and where and not where.rpartition(":")[2].isdigit():
        where = f"{where.rstrip('/')}:{RAY_CLIENT_PORT}"
    host, sep, port = where.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadValue(f"--address must be auto, HOST:PORT or ray://HOST[:PORT] (a port from 1 to 65535), got "
                       f"{address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            grpc = _speaks_grpc(sock)
    except TimeoutError:
        grpc = False
    except OSError as e:
        raise Unreachable(f"cannot reach a Ray cluster at {address}: {e.strerror or e}") from None
    if not grpc:
        what = (f"a Ray cluster's client server (port {RAY_CLIENT_PORT} by default)" if client else
                "a Ray cluster's head (give the address `ray start --head` printed, port 6379 by default)")
        raise Unreachable(f"{address} answers, but not as {what}")


def check_ready(address: str | None) -> None:
    """Ray is installed and ``address`` (``HOST:PORT``) answers, or one line saying which is not: checked before
    a report makes its folder and store, and again when the executor starts."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise MissingDependency("--executor ray needs Ray: pip install 'normlab[scale]'")
    if address == "auto":
        address = _auto_address()
    if address is not None:
        _check_reachable(address)


def _auto_address() -> str | None:
    """``HOST:PORT`` of the cluster ``--address auto`` joins (``RAY_ADDRESS``, else the one ``ray start`` runs on
    this machine), or one line where there is none; None where this Ray cannot say (checked at ``ray.init``)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # Ray's own lookup moved: ray.init reports it
        return None
    if os.environ.get("RAY_ADDRESS", "").startswith("ray://"):
        return None  # Ray Client mode: ray.init connects (and says so where it cannot)
    try:
        return canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as e:
        raise Unreachable(f"--address auto: {str(e).splitlines()[0]} (start one with `ray start --head`, or give "
                          "HOST:PORT)") from None


class RayExecutor:
    """Submits cells as Ray tasks and yields their results as they finish."""

    def __init__(self, address: str | None = None, jobs: int = 1):
        check_ready(address)
        import ray

        self.ray = ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        self._owns = not ray.is_initialized()
        if self._owns:
            try:
                if address is None:  # "local": a private instance, whatever RAY_ADDRESS says (ray.init reads it,
                    ray.init(address="local", num_cpus=jobs, **kwargs)  # and then refused num_cpus: a traceback)
                else:
                    ray.init(address=address, **kwargs)
            except (ConnectionError, ValueError, RuntimeError) as e:
                where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
                raise Unreachable(f"cannot {where}: {_first_line(e)}") from None

    def run(self, call: Callable, fn: Callable, todo: dict[str, dict], device: str = "cpu") -> Iterator[tuple]:
        """Yield ``(key, config, result, seconds, rows)`` for every cell in ``todo``, in finishing order.

        Each task asks for one CPU (and one GPU when ``device`` is CUDA).
        """
        ray = self.ray
        gpus = 1 if str(device).startswith("cuda") else 0
        task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=1)(call)
        device = "cuda" if gpus else device  # Ray gives each task its own GPU, seen as cuda:0
        pending = {task.remote(fn.__module__, fn.__qualname__, c, 1, device): (k, c) for k, c in todo.items()}
        try:
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    k, c = pending.pop(ref)
                    try:
                        result, secs, rows = ray.get(ref)
                    except ray.exceptions.RayError as e:  # a worker that died, a node lost: recorded, retried later
                        cause = getattr(e, "cause", None) or e  # a task's own error, not Ray's header line
                        result, secs, rows = {"status": "error", "error": f"{type(cause).__name__}: "
                                              f"{_first_line(cause)}"}, 0.0, []
                    yield k, c, result, secs, rows
        finally:
            for ref in pending:  # interrupted: in-flight tasks are cancelled, their cells run again on resume
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owns and self.ray.is_initialized():
            self.ray.shutdown()


def _first_line(e: BaseException) -> str:
    """The first line of an error's message, without terminal colour codes (Ray colours its task headers)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    return text.splitlines()[0] if text.strip() else ""
