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
    ``folder``). The lock ends with its process, however it ends."""
    import fcntl

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:  # another process holds it
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise BadValue(f"{shown or folder} is being {doing} by {holder}: {hint}") from None
        except OSError:  # a file system that takes no locks (ENOLCK, EINVAL): the folder is used without one
            locked = False
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {platform.node()}")
        f.flush()
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)
