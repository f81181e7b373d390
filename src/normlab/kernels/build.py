"""Building ``cpu_kernels.cpp`` into a shared library, once per machine and compiler.

The library is cached in the user cache directory (:func:`cache_dir`) under a
name that hashes everything its code depends on: the source, the compiler
(resolved path and ``--version``), the flags (``-march=native`` means the CPU's
ISA: the ``flags`` line of ``/proc/cpuinfo`` is in the hash, not only the model
name). What can go wrong is handled so that a user is never stranded:

* no compiler, a failing compiler or one that hangs (killed after
  :func:`timeout_s`): :class:`BuildError`, and the caller falls back;
* a read-only or unusable cache directory: the library is built in a fresh
  temporary directory for this process instead (a note says so);
* the source is compiled as one translation unit per storage type
  (:data:`UNITS`), all at once, then linked: the build takes about as long as
  its longest unit where there are cores for them;
* several processes meeting the kernels for the first time at once: an
  ``fcntl`` lock beside the library makes one of them build while the others
  wait, and the library appears by an atomic rename.

Environment: ``CXX`` (the compiler, default ``g++``), ``NORMLAB_CXXFLAGS``
(extra flags, e.g. ``-DNORMLAB_NO_FLOAT16``), ``NORMLAB_BUILD_TIMEOUT``
(seconds, default 120), ``NORMLAB_CACHE_DIR``.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import math
import os
import pathlib
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

SOURCE = pathlib.Path(__file__).with_name("cpu_kernels.cpp")
#: -ffp-contract=off: no fused multiply-add, so the kernels compute the expressions as written (the vector
#: body and the scalar tail of a row agree, and the bits do not depend on the compiler's contraction choices)
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17")


class BuildError(Exception):
    """The kernels could not be built here; the message says why in one line."""


def cache_root() -> pathlib.Path:
    """normlab's user cache: ``$NORMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/normlab``, else ``~/.cache/normlab``."""
    root = os.environ.get("NORMLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "normlab"
    )
    return pathlib.Path(root)


def cache_dir() -> pathlib.Path:
    """Where built kernels are kept (created on demand)."""
    return cache_root() / "kernels"


DEFAULT_TIMEOUT_S = 120.0


def timeout_s() -> float:
    """Seconds a compiler may run (``$NORMLAB_BUILD_TIMEOUT``, default 120); a value that is no positive number of
    seconds is a BuildError naming it (the kernels fall back with one warning; it raised at every call)."""
    text = os.environ.get("NORMLAB_BUILD_TIMEOUT") or str(DEFAULT_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise BuildError(f"NORMLAB_BUILD_TIMEOUT={text!r} is not a number of seconds > 0")
    return value


def compiler() -> list[str] | None:
    """The compiler command (``$CXX`` may carry arguments, e.g. ``ccache g++``), or None."""
    cxx = os.environ.get("CXX")
    if cxx:
        return _words("CXX", cxx)
    found = shutil.which("g++") or shutil.which("c++")
    return [found] if found else None


def flags() -> tuple[str, ...]:
    return (*FLAGS, *_words("NORMLAB_CXXFLAGS", os.environ.get("NORMLAB_CXXFLAGS", "")))


def _words(name: str, text: str) -> list[str]:
    """``text`` split as a shell would; a BuildError naming the variable where it cannot be (shlex's ValueError
    stopped every norm call)."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise BuildError(f"{name}={text!r} cannot be split into words ({e})") from None


def isa_flags() -> str:
    """The CPU's model and instruction-set flags (what ``-march=native`` compiles for)."""
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith(("model name", "flags", "Features", "CPU part")) and ln not in lines:
                    lines.append(ln)
                if ln.strip() == "":  # the first processor's block is enough
                    break
    except OSError:
        pass
    return "".join(lines) or f"{platform.machine()} {platform.processor()}"


def _run_all(argvs: list[list[str]], timeout: float) -> list[str]:
    """Run ``argvs`` at once and return their stdouts; BuildError (the first failure's, in order) if any fails, or
    after ``timeout`` s in all; the others are then killed (each runs in its own process group)."""
    procs, outs = [], []
    try:
        for argv in argvs:
            try:
                procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True))
            except OSError as e:
                raise BuildError(f"cannot run {argv[0]}: {e.strerror or e}") from None
        deadline = time.monotonic() + timeout
        for argv, p in zip(argvs, procs):
            try:
                out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                raise BuildError(f"{shlex.join(argv[:2])}... timed out after {timeout:g} s") from None
            if p.returncode != 0:
                detail = (err or out).strip().splitlines()
                raise BuildError(f"{shlex.join(argv[:2])}... exited with {p.returncode}"
                                 + (f": {detail[0][:200]}" if detail else ""))
            outs.append(out)
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


def _run(argv: list[str], timeout: float) -> str:
    """stdout of ``argv``; BuildError on failure or after ``timeout`` s (the whole process group is killed)."""
    return _run_all([argv], timeout)[0]


def _version(cxx: tuple[str, ...]) -> str:
    """``cxx --version``, run once per process and compiler command (the build, the dispatch key and the
    inductor probe all ask); its BuildError too: a compiler that hangs is waited for once, not at every ask."""
    out = _version_or_error(cxx)
    if isinstance(out, BuildError):
        raise out
    return out


@functools.cache
def _version_or_error(cxx: tuple[str, ...]) -> str | BuildError:
    try:
        limit = timeout_s()
    except BuildError:  # (a malformed NORMLAB_BUILD_TIMEOUT stops normlab's build, not inductor's compiler)
        limit = DEFAULT_TIMEOUT_S
    try:
        return _run([*cxx, "--version"], limit)
    except BuildError as e:
        return e


def compiler_problem() -> str | None:
    """Why the C++ compiler cannot be used here (none found, it fails or it hangs past the build timeout), or None
    where it answers ``--version``."""
    try:
        cxx = compiler()
        if cxx is None:
            return NO_COMPILER
        _version(tuple(cxx))
    except BuildError as e:
        return str(e)
    return None


#: what :func:`compiler_problem` says where no compiler is found at all
NO_COMPILER = "no C++ compiler (g++ or c++, or $CXX)"


def key(cxx: list[str]) -> str:
    """The cache key: source, compiler path and version, flags, CPU ISA."""
    version = _version(tuple(cxx))
    path = shutil.which(cxx[0]) or cxx[0]
    parts = [SOURCE.read_bytes(), " ".join(cxx).encode(), os.path.realpath(path).encode(), version.encode(),
             " ".join(flags()).encode(), isa_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@contextlib.contextmanager
def _locked(fd: int, wait_s: float):
    """Hold an exclusive ``fcntl`` lock on the open file ``fd`` (waiting at most ``wait_s``, then going on
    without it: the rename that publishes a library is atomic, a second build only costs time); closes ``fd``.
    Yields whether the lock is held."""
    try:
        deadline, held = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        yield held
    finally:
        os.close(fd)  # releases the lock


#: translation units (``-DNORMLAB_UNIT=k``: one storage type each), compiled in parallel and linked: on 2 cores the
#: build takes about as long as its longest unit, well under the whole file at once
UNITS = (1, 2, 3, 4)


def _compile(cxx: list[str], folder: pathlib.Path, name: str) -> pathlib.Path:
    out = folder / name
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
    tmp = work / name
    try:
        objs = [work / f"unit{u}.o" for u in UNITS]
        _run_all([[*cxx, *flags(), "-c", f"-DNORMLAB_UNIT={u}", str(SOURCE), "-o", str(o)]
                  for u, o in zip(UNITS, objs)], timeout_s())
        _run([*cxx, *flags(), *map(str, objs), "-o", str(tmp)], timeout_s())
        os.replace(tmp, out)  # atomic: a reader sees no library or a whole one
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def build() -> tuple[pathlib.Path, str | None]:
    """Path of the built library and a note (None, or why it lives in a temporary directory).

    Raises BuildError where no compiler works.
    """
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX)")
    name = f"normlab_cpu_{key(cxx)}.so"
    folder = cache_dir()
    if (folder / name).exists():
        return folder / name, None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        return _in_temp(cxx, name, folder, e)
    with _locked(fd, wait_s=timeout_s() + 10):
        if (folder / name).exists():  # another process built it while this one waited
            return folder / name, None
        try:
            return _compile(cxx, folder, name), None
        except OSError as e:  # the lock file was there, but the folder takes no new file
            return _in_temp(cxx, name, folder, e)


def _in_temp(cxx: list[str], name: str, folder: pathlib.Path, e: OSError) -> tuple[pathlib.Path, str]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="normlab-kernels-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    note = f"cache {folder} is not writable ({e.strerror or e}); built in {tmp} for this process"
    return _compile(cxx, tmp, name), note
