"""``auto`` measures where it runs: each kind of call is timed once per machine, then remembered.

The first time ``auto`` meets a kind of call, the **key** (op, dtype, row-length
bucket and whether rows have a tail, thread count, device, and whether autograd is recording: ``train`` or
``fwd``), with more than one kernel able to run it, it
times those kernels on a sample of that row length and keeps the fastest (as
cuDNN's benchmark mode and Triton's autotuner do). The decision is kept for
the process (it never changes mid-run) and saved, with the time of each
candidate, in ``dispatch.json`` beside the built kernels (or ``$NORMLAB_DISPATCH_FILE``), for this
configuration (:func:`machine`: the CPU's ISA flags, the core count, the torch and normlab versions, the
instruction set torch's kernels use, a digest of the kernel source and the kernels' build). The file keeps one
section per configuration, so two configurations sharing it (another build, ``ATEN_CPU_CAPABILITY``) do not
erase each other's decisions; a file holding only other machines' or configurations' sections, or one that does
not parse, is ignored with one warning (then this configuration's section is added).

* **Candidates** (:data:`TIMED`): the kernels that need no compile on first
  use and pass the numerics contract for the call (``supports()``). The
  compiled path is not timed (its first call compiles for seconds); it runs
  where the fixed table puts it.
* **The sample**: rows of the call's own row length, an output of
  :data:`SAMPLE_MAX_BYTES` on CPU whatever the size of the first call
  (:func:`sample_rows`: in cache, a kernel's memory traffic does not show,
  and the decision holds for the machine's large calls), forward then
  backward (a training step's pair) for a ``train`` key, the forward alone
  for an ``fwd`` key (inference: under ``no_grad`` or ``inference_mode``,
  where no backward follows), each candidate once
  to warm up, then :data:`REPEATS` rounds interleaved; a candidate's time is
  its fastest round. Where the two fastest are within :data:`CLOSE`, a
  second fresh sample is timed the same way and each keeps its fastest round
  of both (a decision is kept for good: a close call gets a second look). torch's own kernel (``native``) where it is a
  candidate, else the fixed table's choice, is kept unless another candidate
  is :data:`MARGIN` faster: noise does not flip a tie, and a tie goes to
  torch, so ``auto`` is never slower than torch by more than the noise. The sample's values repeat a block of
  :data:`SAMPLE_BLOCK` seeded draws (drawing each one cost more than the timing). Cost per key, paid once per
  machine: tens of ms on CPU (about 100 at most; docs/performance.md).
* **Two modes, two decisions**: torch's forward-only kernel can beat the
  C++ one where the C++ pair wins forward+backward, so inference and training
  each get the faster. Within a mode every guarantee of ``docs/numerics.md``
  holds bitwise; between the modes a forward agrees within the contract's
  accuracy bounds, not necessarily to the bit.
* **No rows bucket in the key**: if two batch sizes could pick two kernels,
  a row computed alone and the same row inside a batch would come out of
  different kernels, and bitwise batch invariance (``docs/numerics.md``)
  would break. The number of rows only sets the sample's size.
* **Off**: ``NORMLAB_AUTOTUNE=0`` or :func:`set_autotune` (False); and
  whenever there is no timer to trust (tracing, scripting, export,
  ``torch.compile``): then ``auto`` uses the fixed table.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import pathlib
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch

from .._checks import acc_dtype, check_flag, env_on
from . import build
from .base import OP_SPECS, Kernel

#: kernels ``auto`` may time (no compile on first use)
TIMED = ("cpu", "native")
#: elements in the timing sample (rows = SAMPLE_ELEMS // D): 512 KB of float32, about an L2
SAMPLE_ELEMS = 1 << 17
REPEATS = 3
#: another candidate must be this much faster (relative) to displace torch's kernel (else the fixed table's choice)
MARGIN = 0.05
#: where the two fastest candidates are within this (relative) after the first rounds, a second fresh sample is
#: timed as many rounds and each candidate keeps its fastest of all: a decision is kept for good, and one
#: full-grid bench run took torch's float32 add + LayerNorm forward on a round 12% faster where five fresh
#: decisions found the C++ kernel 1.3-1.7x faster (docs/performance.md)
CLOSE = 0.25
#: the decision file: ``{"format": FORMAT, "configs": [{"machine": machine(), "decisions": {key: Decision}}, ...]}``,
#: one section per configuration (this one first), so processes of two configurations sharing a file keep both
FORMAT = 2
#: sections kept in the file: this configuration's and the most recent others' (older versions' fall out)
MAX_CONFIGS = 4
#: a larger file is no dispatch cache (one configuration's section is a few kB; MAX_CONFIGS of them stay far below):
#: it is not read (a corrupt 1 GB file cost 2.3 GB and 11 s, or the user's call a MemoryError)
MAX_FILE_BYTES = 8 << 20
#: where the decisions are kept, if not beside the built kernels (the test suite keeps its own, so that timings
#: taken under its load never become a user's decisions)
FILE_ENV = "NORMLAB_DISPATCH_FILE"

_enabled: bool | None = None  # None: NORMLAB_AUTOTUNE, read at first use


def enabled() -> bool:
    """Whether ``auto`` measures (``NORMLAB_AUTOTUNE``, default on, unless :func:`set_autotune` said otherwise)."""
    global _enabled
    if _enabled is None:
        _enabled = env_on("NORMLAB_AUTOTUNE")
    return _enabled


def set_autotune(on: bool | None) -> bool:
    """Switch measuring on or off for the process (None: read ``NORMLAB_AUTOTUNE`` again); returns the old state."""
    global _enabled
    if on is not None:
        check_flag(on, "set_autotune's argument")  # (set_autotune("off") turned it on)
    old = enabled()
    _enabled = None if on is None else bool(on)
    return old


def row_bucket(d: int) -> int:
    """The row-length bucket: the next power of two at or above ``d``."""
    return 1 << max(d - 1, 0).bit_length()


def mode(records: bool | None = None) -> str:
    """``train`` where autograd records the call (a backward may follow), else ``fwd``. ``records``: whether it
    does (grad mode on and an input that requires grad); None: grad mode alone decides (a call of unknown
    inputs, such as :func:`normlab.kernels.decide`'s)."""
    return "train" if (torch.is_grad_enabled() if records is None else records) else "fwd"


def row_class(d: int, dtype: torch.dtype) -> str:
    """The row-length bucket, ``d<2^k>``, with ``t`` appended where rows have a tail: more elements than whole
    blocks of the C++ kernels' row accumulators (one cache line of the accumulation type: 16 float32 or 8 float64
    values), whose last part they read, sum and store by part vectors. Rows of 75 and of 80 can want different
    kernels (bfloat16 ``add_layer_norm`` forward, before part vectors: C++ 4.60 against torch 4.23 ms at 75, 1.85
    against 2.93 ms at 80), and one must not decide for the other."""
    block = 64 * 8 // torch.finfo(acc_dtype(dtype)).bits  # accumulators in one cache line
    return f"d{row_bucket(d)}{'' if d % block == 0 else 't'}"


def key(op: str, x: torch.Tensor, d: int, records: bool | None = None) -> str:
    dev = str(x.device)
    return (f"{op}|{str(x.dtype).removeprefix('torch.')}|{row_class(d, x.dtype)}"
            f"|t{torch.get_num_threads()}|{dev}|{mode(records)}")


def machine() -> dict:
    """What a decision is valid for: this CPU's ISA, its core count, this torch and the instruction set its
    kernels run (``ATEN_CPU_CAPABILITY`` lowers it), these kernels (normlab's version and the kernels' sources,
    C++ and the Python that allocates their outputs, and this module, which times them: a changed kernel or way
    of timing is measured again) and how they were compiled (compiler and flags: ``NORMLAB_CXXFLAGS``)."""
    from .. import __version__

    return {"isa": hashlib.sha256(build.isa_flags().encode()).hexdigest()[:16], "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_isa": torch.backends.cpu.get_cpu_capability(),
            "normlab": __version__, "kernels": _source_digest(), "build": _build_key()}


@functools.cache
def _build_key() -> str:
    """The built kernels' cache key (source, compiler, flags, ISA); "none" where no compiler works."""
    try:
        cxx = build.compiler()
        return build.key(cxx) if cxx else "none"
    except build.BuildError:
        return "none"


@functools.cache
def _source_digest() -> str:
    from . import cpu

    return hashlib.sha256(build.SOURCE.read_bytes() + pathlib.Path(cpu.__file__).read_bytes()
                          + pathlib.Path(__file__).read_bytes()).hexdigest()[:16]


@dataclass
class Decision:
    impl: str
    why: str  # "measured", "cached", "only candidate", "fixed table (...)"
    ms: dict[str, float] = field(default_factory=dict)  # candidate -> fastest round on the sample (fwd+bwd or fwd)
    sample: str = ""  # rows x D
    cost_ms: float = 0.0  # what measuring cost, timing and sample included


def _saved(v) -> Decision:
    """A decision as the cache file holds it; TypeError where its fields are not what :class:`Decision` holds (a
    list where the implementation's name belongs failed every later call)."""
    ok = (isinstance(v, dict) and isinstance(v.get("impl"), str) and isinstance(v.get("sample", ""), str)
          and isinstance(v.get("ms", {}), dict)
          and all(isinstance(k, str) and _number(t) for k, t in v.get("ms", {}).items())
          and _number(v.get("cost_ms", 0.0)) and set(v) <= {"impl", "why", "ms", "sample", "cost_ms"})
    if not ok:
        raise TypeError(f"a decision must hold impl (a name), ms, sample and cost_ms, got {str(v)[:60]}")
    return Decision(**{**v, "why": "cached"})


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: the timing sample's output (bytes) on CPU, or twice the cores' own caches if larger: out of cache, as the calls
#: where the time goes are (measured: full-size samples of 25 MB cost 100-660 ms a decision, their fresh pages
#: faulting in, and picked no better)
SAMPLE_MAX_BYTES = 8 << 20
#: rows shorter than a cache line are timed on at most SAMPLE_MAX_ROWS rows (a float32 row of 1 element:
#: 2M rows of the 8 MB took 0.55 s a decision, 0.2 s forward only)
SHORT_ROW_BYTES = 64
SAMPLE_MAX_ROWS = 1 << 18

#: seconds a save waits for another process's save (a few ms each) before it writes anyway
LOCK_WAIT_S = 5.0


def sample_rows(x: torch.Tensor, d: int) -> int:
    """Rows of the timing sample: on CPU, an output of ``SAMPLE_MAX_BYTES`` or twice the cores' own caches
    (``threads x cpu.private_cache_bytes()``), whichever is larger, whatever the size of the call that asks;
    elsewhere ``SAMPLE_ELEMS // D``.

    The decision holds for every call of its key, and is saved for the machine, so it is taken where the time
    goes: out of cache, with outputs streamed (the sample is at least ``cpu.stream_bytes``, which is at most the
    cores' own caches). Measured: an in-cache sample picked the C++ pair for float32 LayerNorm at 8192x768 where,
    at the call's size, torch's was 10-20% faster; and when the sample followed the first call's size, a small
    first call (a test, a warm-up at batch 1) decided in cache for every later call on the machine, torch's
    kernel kept on a 5% tie where the C++ pair was 1.4x faster at 8192x768 (docs/performance.md).
    """
    d = max(d, 1)
    rows = max(1, SAMPLE_ELEMS // d)
    if x.device.type == "cpu":
        from .cpu import own_cache_bytes, stream_bytes

        row_bytes = d * x.element_size()
        target = max(SAMPLE_MAX_BYTES, 2 * own_cache_bytes(), stream_bytes())
        rows = max(rows, -(-target // row_bytes))
        if row_bytes < SHORT_ROW_BYTES:  # their cost is per row, not per byte: the bytes' rows took 0.5 s at D = 1
            rows = min(rows, SAMPLE_MAX_ROWS)
    return rows


#: random values per sample tensor, repeated to its size: drawing every value (a seeded uniform_ runs on one
#: thread) cost 33-164 ms of the 50-180 ms a large decision took; timing needs values of the right kind (finite,
#: varied, not denormal), not fresh ones
SAMPLE_BLOCK = 1 << 12


def _sample(op: str, dtype: torch.dtype, d: int, device, n: int) -> tuple:
    g = torch.Generator(device=device).manual_seed(0)

    def t(*shape):
        size = math.prod(shape)
        block = torch.empty(min(max(size, 1), SAMPLE_BLOCK), device=device).uniform_(-2, 2, generator=g)
        return block.repeat(-(-size // block.numel()))[:size].to(dtype).view(shape)

    spec = OP_SPECS[op]
    x, dy, w = t(n, d), t(n, d), t(d)
    r, ds = (t(n, d), t(n, d)) if spec.add else (None, None)
    b = None if spec.rms else t(d)
    return spec, x, r, w, b, dy, ds


def _time(kernels: dict[str, Kernel], op: str, x: torch.Tensor, d: int, eps: float,
          backward: bool = True) -> tuple[dict, str]:
    """Fastest round of each kernel on a fresh sample (ms; forward+backward, or the forward alone), and the
    sample's shape."""
    spec, xs, r, w, b, dy, ds = _sample(op, x.dtype, d, x.device, sample_rows(x, d))
    sync = torch.cuda.synchronize if xs.is_cuda else (lambda: None)

    def step(k: Kernel):
        if not backward:  # what an inference call runs
            k.infer(xs, r, w, b, eps, rms=spec.rms, s_dtype=xs.dtype)
            return
        y, s, mean, rstd = k.fwd(xs, r, w, b, eps, rms=spec.rms, s_dtype=xs.dtype)
        k.bwd(dy, xs if s is None else s, mean, rstd, w, ds, rms=spec.rms)

    best = {name: float("inf") for name in kernels}
    with torch.no_grad():
        for k in kernels.values():
            step(k)
        for i in range(REPEATS):
            names = list(kernels)
            for name in names[i % len(names):] + names[: i % len(names)]:  # the order rotates
                sync()
                t0 = time.perf_counter()
                step(kernels[name])
                sync()
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return {n: round(v, 4) for n, v in best.items()}, f"{xs.shape[0]}x{d}"


def _close(ms: dict[str, float]) -> bool:
    """Whether the two fastest candidates' times are within :data:`CLOSE` of each other."""
    first, second = sorted(ms.values())[:2]
    return second < (1 + CLOSE) * first


class Tuner:
    """Decisions per key: measured once, kept for the process, saved to ``path`` for the machine."""

    def __init__(self, path: pathlib.Path | None = None):
        self._path = path
        self._lock = threading.Lock()
        self._decisions: dict[str, Decision] | None = None
        #: why the last save did not write the file (None: it did, or nothing was saved yet)
        self.unsaved: str | None = None
        #: whether a save found the lock held for all of LOCK_WAIT_S (a stopped process holds it): later saves try
        #: it once and go on, instead of waiting that long for every decision
        self.lock_stuck = False
        #: dispatch's memo of what ``auto`` runs for each kind of eager call (op, dtype, device, row length,
        #: eps, whether autograd records it, threads, compiled allowed): filled as decisions are taken, never changed
        self.routes: dict[tuple, str] = {}

    @property
    def path(self) -> pathlib.Path:
        """The decision file: the one given, else ``$NORMLAB_DISPATCH_FILE``, else ``dispatch.json`` beside the built
        kernels."""
        return self._path or pathlib.Path(os.environ.get(FILE_ENV) or build.cache_dir() / "dispatch.json")

    @property
    def chosen(self) -> bool:
        """Whether the file is the one ``$NORMLAB_DISPATCH_FILE`` names, not normlab's own beside its kernels (or
        the one this tuner was made for): there a file that is not a dispatch cache may be the user's, and is left
        as it is, and no folder is made for it."""
        return self._path is None and bool(os.environ.get(FILE_ENV))

    def _read(self) -> tuple[dict[str, Decision], list[dict] | None, str | None]:
        """This configuration's saved decisions, the other configurations' sections (kept when the file is
        rewritten; None where the file is a newer normlab's, never rewritten), and why none of it is usable here
        (None if the file was fine or absent)."""
        kept = "; it is left as it is, and this process's decisions are not saved" if self.chosen else ""
        # a file the user named may be theirs: whatever keeps it from being read as a cache leaves it alone (an
        # unreadable one was replaced by this process's decisions, readable by all)
        left = None if self.chosen else []
        try:
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode):  # a FIFO blocked the first call; a folder cannot be replaced either,
                # and a link to a device or FIFO had it replaced by the decisions: left as it is wherever it is
                return {}, None, "is not a regular file; it is left as it is, and this process's decisions are " \
                                 "not saved"
            if st.st_size > MAX_FILE_BYTES:
                return {}, left, f"is {st.st_size} bytes, larger than any dispatch cache{kept}"
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # nothing saved (or no usable cache: the build says so)
            return {}, [], None
        except OSError as e:
            return {}, left, f"cannot be read ({e.strerror or e}){kept}"
        try:
            data = json.loads(raw.decode("utf-8"))  # (a UnicodeDecodeError is a ValueError)
            if data.get("format") != FORMAT:  # an older format is replaced; a newer normlab's file is left alone
                known = type(data.get("format")) is int and "configs" in data  # a normlab dispatch file
                if not known:
                    raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
                newer = data["format"] > FORMAT
                return {}, None if newer else [], (f"has format {data.get('format')!r}, not {FORMAT}"
                                                   + (" (a newer normlab's: left as it is)" if newer else ""))
            if not isinstance(data["configs"], list):
                raise TypeError("configs must be a list of sections")
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:  # (RecursionError: nesting)
            # in normlab's own cache folder it is replaced; a file the user named may be theirs: left alone
            return {}, left, f"is not a valid dispatch cache ({type(e).__name__}: {str(e)[:80]}){kept}"
        here, own, others, damaged = machine(), None, [], None
        for section in data["configs"]:  # a damaged section is dropped alone (when the file is next written): the
            try:  # other configurations' are kept (one bad decision of this one's erased all of theirs)
                if not isinstance(section, dict) or not isinstance(section["machine"], dict) or \
                        not isinstance(section["decisions"], dict):
                    raise TypeError("a section's machine and decisions must be objects")
                if section["machine"] == here:
                    own = {k: _saved(v) for k, v in section["decisions"].items()}
                else:
                    others.append(section)
            except (ValueError, TypeError, KeyError, AttributeError) as e:  # (this one's decisions measured again)
                damaged = damaged or f"is not a valid dispatch cache ({type(e).__name__}: {str(e)[:80]})"
        if damaged:
            return {}, others, damaged
        if own is None and others:
            return {}, others, ("holds decisions of another machine, torch, normlab or kernel build only "
                                f"({others[0]['machine']})")
        return own or {}, others, None

    def _load(self) -> dict[str, Decision]:
        """What :meth:`_read` finds; an unusable file is ignored with one warning (this runs once per process)."""
        decisions, _, problem = self._read()
        if problem:
            warnings.warn(f"normlab: ignoring {self.path}: it {problem}; dispatch decisions are measured again",
                          RuntimeWarning, stacklevel=6)
        return decisions

    def _save(self, k: str, dec: Decision, candidates) -> Decision:
        """Merge this process's decisions into this configuration's section of the file, atomically (a temporary
        file renamed over the old one), the other configurations' sections kept, one process at a time (a lock
        file beside it: two processes saving at once would each drop the other's new decisions); silent where
        the cache is read-only (the decisions then live for this process only). ``dec``: the decision just
        measured for key ``k``; where another process saved one for it meanwhile (both measured at once: ranks or
        workers on a cold cache), that one is returned and kept instead, so every process of the machine runs the
        same kernel (two ran ``cpu`` and ``native`` for one call, their bits differing, and the file kept the
        last writer's)."""
        tmp, kept = None, dec  # (dec where the file cannot be read or written)
        try:
            if not self.chosen:  # normlab's own cache folder (a folder of a path the user gave is theirs to make)
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # opened read-only (flock needs no write access: a lock file another user made still locks); a holder
            # that never lets go (a stopped process) delays the first save by LOCK_WAIT_S, then it goes on
            lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o666)
            with build._locked(lock, wait_s=0.0 if self.lock_stuck else LOCK_WAIT_S) as held:
                self.lock_stuck = not held
                saved, others, problem = self._read()
                theirs = saved.get(k)
                if theirs is not None and theirs.impl in candidates:
                    kept = theirs
                if others is None:  # a newer normlab's file, or a user's: this process's decisions live in it alone
                    self.unsaved = f"{self.path} {problem}"
                    return kept
                merged = {**saved, **self._decisions, k: kept}
                own = {"machine": machine(),
                       "decisions": {k: {**asdict(v), "why": "measured"} for k, v in sorted(merged.items())}}
                data = {"format": FORMAT, "configs": [own, *others[: MAX_CONFIGS - 1]]}
                # a link's target is rewritten (renamed over, the link became a file); realpath, not Path.resolve,
                # which raised RuntimeError on a link that loops (it is replaced: it was no cache)
                target = pathlib.Path(os.path.realpath(self.path))
                fd, tmp = tempfile.mkstemp(suffix=".json", dir=target.parent)
                if hasattr(os, "fchmod"):  # readable as the built kernels beside it (mkstemp's 0600 hid it from a team)
                    os.fchmod(fd, 0o644)
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1)
                os.replace(tmp, target)
                tmp = None
                self.unsaved = None
        except OSError as e:
            self.unsaved = f"{self.path}: {e.strerror or e}"
        finally:
            self._decisions[k] = kept  # set once, before any call runs it
            if tmp is not None:  # written but not renamed (the path is a folder, the disk is full): not left behind
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return kept

    def decisions(self) -> dict[str, Decision]:
        with self._lock:
            if self._decisions is None:
                self._decisions = self._load()
            return dict(self._decisions)

    def known(self, op: str, x: torch.Tensor, d: int, candidates, records: bool | None = None) -> Decision | None:
        """The decision already taken for this kind of call, if any (no lock: decisions are only ever added).
        Eager calls reach it once per route: dispatch remembers the answer in :attr:`routes`."""
        dec = None if self._decisions is None else self._decisions.get(key(op, x, d, records))
        return dec if dec is not None and dec.impl in candidates else None

    def choose(self, op: str, x: torch.Tensor, d: int, eps: float, candidates: dict[str, Kernel],
               fixed: str, records: bool | None = None) -> Decision:
        """The kernel for ``op`` on rows like ``x`` among ``candidates`` (names in the fixed table's order), for
        calls autograd records (``records``; None: grad mode decides) or not."""
        k = key(op, x, d, records)
        with self._lock:
            if self._decisions is None:
                self._decisions = self._load()
            known = self._decisions.get(k)
            if known is not None and known.impl in candidates:
                return known
            t0 = time.perf_counter()
            ms, sample = _time(candidates, op, x, d, eps, backward=mode(records) == "train")
            if len(ms) > 1 and _close(ms):
                again, _ = _time(candidates, op, x, d, eps, backward=mode(records) == "train")
                ms = {n: min(t, again[n]) for n, t in ms.items()}
            best = min(ms, key=ms.get)
            kept = "native" if "native" in ms else fixed  # a tie goes to torch's own kernel: never slower than it
            impl = best if ms[best] < (1 - MARGIN) * ms[kept] else kept
            dec = Decision(impl, "measured", ms, sample, round((time.perf_counter() - t0) * 1e3, 2))
            return self._save(k, dec, candidates)  # never replaced for the rest of the process


TUNER = Tuner()
