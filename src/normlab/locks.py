"""One process at a time in a folder of results: an exclusive ``flock`` on ``folder/.normlab.lock``."""
from __future__ import annotations

import contextlib
import os
import pathlib
import platform

from ._checks import BadValue

#: the lock's file name in each folder it guards
LOCK = ".normlab.lock"


@contextlib.contextmanager
def folder_lock(folder: pathlib.Path, doing: str, hint: str, shown: pathlib.Path | None = None):
    """Hold ``folder/.normlab.lock`` (made with the folder if missing; a name of normlab's own: a user's
    ``.lock`` there was truncated) for the block; where another process holds it,
    one line: ``SHOWN is being DOING by HOLDER: HINT`` (``shown``: the folder the user named, default
    ``folder``). The lock ends with its process, however it ends. Where the block leaves nothing in the folders
    the lock made (a run refused before any work), the lock file and those folders go with it."""
    import fcntl

    folder = pathlib.Path(folder)
    made = [d for d in (folder, *folder.parents) if not d.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    f, locked = _open_locked(folder / LOCK, shown or folder, doing, hint)
    with f:
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {platform.node()}")
        f.flush()
        try:
            yield
        finally:
            if made and os.listdir(folder) == [LOCK]:  # removed while held: a process that opened it since
                with contextlib.suppress(OSError):  # finds it gone when it holds it, and opens the new one
                    (folder / LOCK).unlink()
                    for d in made:
                        d.rmdir()
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)


def _open_locked(path: pathlib.Path, shown, doing: str, hint: str):
    """``(file, locked)``: ``path`` opened and locked, the file the name holds now (a holder that removed it as it
    finished left the lock on a file no longer there); ``locked`` False where the file system takes no locks."""
    import fcntl

    while True:
        try:
            f = open(path, "a+")  # noqa: SIM115   (closed here on every way out, else by the caller)
        except FileNotFoundError:  # a holder that left nothing took its folder with it, after we made it: again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise BadValue(f"{shown} is being {doing} by {holder}: {hint}") from None
        except OSError:  # a file system that takes no locks (ENOLCK, EINVAL): the folder is used without one
            return f, False
        except BaseException:
            f.close()
            raise
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                return f, True
        except FileNotFoundError:
            pass
        f.close()  # (the lock ends with it) the name holds another file now, or none: lock that one
