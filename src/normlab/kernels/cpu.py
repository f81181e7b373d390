"""normlab's own CPU kernels: ``cpu_kernels.cpp``, compiled at first use, called through ctypes.

The C++ source needs no torch headers, so it builds with the system's ``g++``
(or ``$CXX``) alone, once per machine (about 13 s on 2 cores), and no ABI ties
it to a torch version; :mod:`normlab.kernels.build` caches it per
machine and compiler and copes with a missing, failing or hanging compiler, a
read-only cache and concurrent first use. Where the kernels cannot be built,
:meth:`CpuKernel.supports` is False and ``auto`` falls back, with one warning;
where the compiler has no ``_Float16``, only float16 falls back.

What the kernels do (rows of float32, float64, bfloat16 or float16; statistics,
weights and weight gradients in the accumulation dtype: float64 for float64,
float32 otherwise; outputs rounded once to the input's dtype):

* forward, one parallel loop over rows: ``s = x + r`` (add variants),
  ``mean = sum(s) / D``, ``var = sum((s - mean)^2) / D`` (two passes over a row
  held in L1), ``rstd = 1 / sqrt(var + eps)``,
  ``y = (s - mean) * rstd * w + b``;
* backward, single pass over memory: each fixed block of 32 rows computes
  ``dx = rstd * (g - mean(g) - x_hat * mean(g x_hat))`` (``g = dy * w``; RMSNorm
  drops ``mean(g)``) and accumulates its partial ``dw = sum dy x_hat`` and
  ``db = sum dy``; a second loop adds the partial rows in block order. The add
  variants' ``dx`` (the gradient of ``x`` and of the residual) is written twice
  in that pass where both inputs need it (``bwd_pair``): autograd would copy it.
"""
from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import platform
import warnings

import torch

from .._checks import acc_dtype, env_on
from . import build
from .base import Kernel, add_residual

_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16"}


def cache_dir():
    """Where the built library is kept (see :mod:`normlab.kernels.build`)."""
    return build.cache_dir()


def _warn(msg: str) -> None:
    warnings.warn(f"normlab: {msg}", RuntimeWarning, stacklevel=4)


def declare(lib: ctypes.CDLL) -> set:
    """Give a loaded build of ``cpu_kernels.cpp`` its entry points' C signatures; returns the dtypes it has."""
    dtypes = {torch.float32, torch.float64, torch.bfloat16}
    if lib.normlab_has_f16():
        dtypes.add(torch.float16)
    p, i64, dbl, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for dt in dtypes:
        getattr(lib, f"normlab_fwd_{_SUFFIX[dt]}").argtypes = [p] * 8 + [i64, i64, dbl, i32, i32, i32]
        getattr(lib, f"normlab_bwd_{_SUFFIX[dt]}").argtypes = [p] * 11 + [i64, i64, i32, i32, i32]
    lib.normlab_rows_per_partial.restype = i64
    return dtypes


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, frozenset]:
    """The loaded kernels and the dtypes they were built for; ``(None, {})`` where none could be built.

    A fact about the machine, computed once (so each failure is warned once); never changed by what a
    caller is doing (tracing, exporting, compiling).
    """
    global _why_unavailable
    if platform.system() != "Linux":
        _why_unavailable = f"normlab builds its C++ kernels on Linux, not {platform.system()}"
        return None, frozenset()
    try:
        path, note = build.build()
        lib = ctypes.CDLL(str(path))
    except (build.BuildError, OSError) as e:
        _why_unavailable = str(e)
        _warn(f"CPU kernels unavailable ({e}); using the other implementations")
        return None, frozenset()
    dtypes = declare(lib)
    notes = [note] if note else []
    if torch.float16 not in dtypes:
        notes.append("built without float16 (the compiler has no _Float16); float16 uses the other implementations")
    if notes:
        _warn("CPU kernels: " + "; ".join(notes))
    return lib, frozenset(dtypes)


_why_unavailable: str | None = None  # what stopped the kernels' build or load (None: they loaded, or not tried)


def unavailable_reason() -> str | None:
    """Why there are no C++ kernels here (None where they loaded)."""
    return None if available() else _why_unavailable


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where no C++ compiler works (warned once)."""
    return _load()[0]


def dtypes() -> frozenset:
    """The dtypes the built kernels handle (empty where there are none)."""
    return _load()[1]


def available() -> bool:
    return library() is not None


#: outputs this large or larger are written with streaming stores (``NORMLAB_STREAM_BYTES`` overrides; 0: always)
STREAM_ENV = "NORMLAB_STREAM_BYTES"


@functools.cache
def _caches() -> tuple[tuple[int, int], ...]:
    """(level, bytes) of each CPU cache sysfs lists for cpu0 (empty where it cannot be read)."""
    out = []
    for d in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
            out.append((int((d / "level").read_text()), int(text.rstrip("KMG")) << {"K": 10, "M": 20,
                                                                                  "G": 30}.get(text[-1:], 0)))
        except (OSError, ValueError):
            continue
    return tuple(out)


@functools.cache
def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (Linux sysfs; 32 MiB where it cannot be read)."""
    return max((size for _, size in _caches()), default=32 << 20)


@functools.cache
def private_cache_bytes() -> int:
    """The largest cache below the last level (the L2 on most x86 and Arm servers): one core's own, which a
    call fits in without touching the shared cache, which on a shared host other tenants use too. 1 MiB
    where sysfs cannot say."""
    caches = _caches()
    top = max((level for level, _ in caches), default=0)
    return max((size for level, size in caches if level < top), default=1 << 20)


def own_cache_bytes(threads: int | None = None) -> int:
    """The caches of the cores a call runs on: ``threads`` (default: torch's thread count) times
    :func:`private_cache_bytes`."""
    return (torch.get_num_threads() if threads is None else threads) * private_cache_bytes()


@functools.cache
def _stream_override() -> int | None:
    given = os.environ.get(STREAM_ENV)
    if given is None:
        return None
    try:
        value = int(given)
    except ValueError:
        value = -1
    if value < 0:  # (a negative count read as 0: every output streamed, without a word)
        _warn(f"{STREAM_ENV}={given!r} is not a byte count; using the cores' own caches")
        return None
    return value


def stream_bytes(threads: int | None = None) -> int:
    """Outputs of at least this many bytes are streamed: written without being read first (a third less memory
    traffic, the same bits). That is an output larger than the caches of the cores writing it
    (:func:`own_cache_bytes`), or than the last-level cache where that is smaller. The shared cache beyond the
    cores' own is no place to keep it: on a virtual machine it is the host's, shared with other tenants (an
    Intel Xeon listed 260 MB; on a 2-core AMD EPYC listing 32 MB this rule took 5-35% less time for float32
    LayerNorm than streaming only above the last-level cache, from memory and warm: docs/performance.md)."""
    given = _stream_override()
    return given if given is not None else min(last_level_cache_bytes(), own_cache_bytes(threads))


def streamed(out: torch.Tensor) -> bool:
    return out.numel() * out.element_size() >= stream_bytes()


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _param(p: torch.Tensor | None, dtype: torch.dtype):
    if p is None or (p.dtype == dtype and p.is_contiguous()):
        return p  # as it is (the kernel only reads it): a copy costs ~6 µs a call
    return p.detach().to(dtype).contiguous()


#: outputs at least this large ask the OS for transparent huge pages (``madvise``), where it has them: glibc's
#: largest mmap threshold, above which every allocation is fresh memory from the OS
HUGE_PAGES_MIN = 32 << 20
#: smaller outputs down to this size ask for them where their memory is fresh (not yet faulted in: glibc gave
#: back what it held and mapped it anew), which glibc's trim rule decides by the sizes freed before; memory it
#: kept, already faulted in, is left as it is (docs/performance.md, "Fresh pages")
FRESH_HUGE_MIN = 4 << 20
_HUGE = 2 << 20  # the x86-64 / aarch64 transparent huge page
_PAGE = 4096
_MADV_HUGEPAGE = 14
#: once a large output turns out fresh, glibc is asked to keep up to this much freed memory at the top of its heap
#: rather than give it back to the OS (``M_TRIM_THRESHOLD``), and to serve blocks below ``HUGE_PAGES_MIN`` from
#: its heap (``M_MMAP_THRESHOLD``, the largest value its own rule reaches); ``NORMLAB_KEEP_FREED=0`` leaves
#: glibc's rules alone, as does a policy of the user's own (``MALLOC_*_`` variables, ``glibc.malloc`` tunables)
KEEP_FREED_BYTES = 256 << 20
KEEP_FREED_ENV = "NORMLAB_KEEP_FREED"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _libc():
    """libc's ``madvise``, ``mincore`` and ``mallopt`` (None where libc has none: not glibc) on Linux, else None."""
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise, mincore = libc.madvise, libc.mincore
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    mincore.argtypes, mincore.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p), ctypes.c_int
    mallopt = getattr(libc, "mallopt", None)  # glibc's (a preloaded jemalloc or tcmalloc ignores it: harmless)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return madvise, mincore, mallopt


def _madvise():
    """libc's ``madvise`` on Linux, else None."""
    return None if (f := _libc()) is None else f[0]


def _resident(addr: int) -> bool:
    """Whether the 4 KB page at ``addr`` (page-aligned) is in memory (``mincore``); True where it cannot be told."""
    if (f := _libc()) is None:
        return True
    vec = (ctypes.c_ubyte * 1)()
    return f[1](addr, _PAGE, vec) != 0 or bool(vec[0] & 1)


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse (once per process; True where it did). Its default rule gives the
    top of its heap back to the OS once more than twice its mmap threshold lies free there, so which large outputs
    come back as fresh memory, faulted in and zeroed page by page inside the kernel, depends on the sizes freed
    before: float32 ``layer_norm`` forward at 8192x768 read 1.8 or 5.6-6.3 ms by run, the same kernel. With it:
    1.2-2.0 ms in every run (docs/performance.md, "Fresh pages"). Process-wide (torch's own allocations keep
    their memory too); at most ``KEEP_FREED_BYTES`` more stays mapped."""
    if not env_on(KEEP_FREED_ENV):
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
            k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")):
        return False  # the user's own policy
    if (f := _libc()) is None or (mallopt := f[2]) is None:
        return False
    # the mmap threshold first: setting either fixes both (glibc stops adjusting them)
    return bool(mallopt(_M_MMAP_THRESHOLD, HUGE_PAGES_MIN) and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def _output(like: torch.Tensor) -> torch.Tensor:
    """A fresh output of ``like``'s shape and dtype. A large one is often memory the kernel is about to touch for
    the first time, page by page: its 2 MB-aligned part is marked for huge pages first, so it faults in 2 MB at
    a time instead of 4 KB (an advice: the values are the same; where the OS declines, nothing changes). From
    ``HUGE_PAGES_MIN`` on always (fresh by glibc's rule); from ``FRESH_HUGE_MIN`` where the first pages of the
    aligned part's two ends are not yet in memory: then glibc is also asked to keep freed memory from now on
    (:func:`keep_freed_memory`), so that later outputs of that size are not fresh."""
    out = torch.empty_like(like)
    nbytes = out.numel() * out.element_size()
    if nbytes >= FRESH_HUGE_MIN and (madvise := _madvise()) is not None:
        start = -(-out.data_ptr() // _HUGE) * _HUGE
        end = (out.data_ptr() + nbytes) // _HUGE * _HUGE
        if end > start and (nbytes >= HUGE_PAGES_MIN or not (_resident(start) and _resident(end - _HUGE))):
            madvise(start, end - start, _MADV_HUGEPAGE)
            if nbytes < HUGE_PAGES_MIN:
                keep_freed_memory()
    return out


@functools.cache
def _entry(kind: str, dtype: torch.dtype):
    """The kernels' C entry point ``normlab_{kind}_{dtype}`` (looked up once per process)."""
    return getattr(library(), f"normlab_{kind}_{_SUFFIX[dtype]}")


def _fwd(x, r, w, b, eps, rms, stats=True):
    n, d = x.shape
    dt, ad = x.dtype, acc_dtype(x.dtype)
    y = _output(x)
    s = _output(x) if r is not None else None
    mean = None if rms or not stats else x.new_empty(n, 1, dtype=ad)
    rstd = x.new_empty(n, 1, dtype=ad) if stats else None
    w, b = _param(w, ad), _param(b, ad)
    _entry("fwd", dt)(_ptr(x), _ptr(r), _ptr(s), _ptr(w), _ptr(b), _ptr(y), _ptr(mean), _ptr(rstd), n, d, eps,
                      int(rms), int(streamed(y)), torch.get_num_threads())
    return y, s, mean, rstd


def _bwd(dy, x, mean, rstd, w, ds, rms, pair=False):
    n, d = x.shape
    dt, ad = x.dtype, acc_dtype(x.dtype)
    dy = dy.to(dt)  # N, D   (a float32 s under a half-precision y: residual_in_fp32)
    ds = None if ds is None else ds.to(dt)
    dx = _output(x)
    dx2 = _output(x) if pair else None
    rows = library().normlab_rows_per_partial()
    partial = x.new_empty((n + rows - 1) // rows, 2, d, dtype=ad)
    dw = x.new_empty(d, dtype=ad) if w is not None else None
    db = None if rms else x.new_empty(d, dtype=ad)
    if n == 0:
        return dx, dx2, None if dw is None else dw.zero_(), None if db is None else db.zero_()
    w = _param(w, ad)  # held in a name: a temporary would be freed before the call reads it
    _entry("bwd", dt)(_ptr(dy), _ptr(x), _ptr(mean), _ptr(rstd), _ptr(w), _ptr(ds), _ptr(dx), _ptr(dx2), _ptr(dw),
                      _ptr(db), _ptr(partial), n, d, int(rms), int(streamed(dx)), torch.get_num_threads())
    return dx, dx2, dw, db


class CpuKernel(Kernel):
    """normlab's C++ kernels: every op, every floating dtype the build has, on CPU."""

    name = "cpu"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        return x.device.type == "cpu" and x.dtype in dtypes()

    def accepts(self, op: str, x: torch.Tensor, eps: float) -> bool:
        return x.device.type == "cpu" and x.dtype in _SUFFIX  # (float8 is no dtype of theirs, built or not)

    def fwd(self, x, residual, w, b, eps, *, rms, s_dtype=None, stats=True):
        if residual is not None and (residual.dtype != x.dtype or (s_dtype or x.dtype) != x.dtype):
            s = add_residual(x, residual, s_dtype or x.dtype)  # N, D   e.g. a float32 s of half x (residual_in_fp32)
            y, _, mean, rstd = _fwd(s, None, w, b, eps, rms, stats)
            return y.to(x.dtype), s, mean, rstd
        return _fwd(x, residual, w, b, eps, rms, stats)

    def infer(self, x, residual, w, b, eps, *, rms, s_dtype=None):
        y, s, _, _ = self.fwd(x, residual, w, b, eps, rms=rms, s_dtype=s_dtype, stats=False)
        return y, s

    def bwd(self, dy, x, mean, rstd, w, ds, *, rms):
        dx, _, dw, db = _bwd(dy, x, mean, rstd, w, ds, rms)
        return dx, dw, db

    def bwd_pair(self, dy, x, mean, rstd, w, ds, *, rms):
        return _bwd(dy, x, mean, rstd, w, ds, rms, pair=True)
