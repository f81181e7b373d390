"""What normlab wrote in a folder, so that it never replaces a file it did not write.

Commands write into folders the user names (``diarize --out``, ``evaluate --html``, ``report --out``), where
the user's own files may already be: a reference RTTM under the recording's name, a page of their own called
``index.html``. Each such folder keeps a list of the files normlab wrote there (:data:`LIST`: each name with
the SHA-256 of what was written). A file about to be written that already exists is replaced only if that list
holds it with its present contents: normlab's own earlier output, unchanged. Anything else (a file normlab did
not write, or one edited since) stops the command before any work, unless the caller asks to overwrite.

Beside ``files``, the list holds ``pending`` (contents about to be moved into place: a stop between the move
and the listing leaves a file that is still normlab's) and ``made`` (what a file was made from, with the
SHA-256 it was made with: a rerun keeps an output made from the same inputs, :func:`made`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from collections.abc import Callable

from ._checks import BadValue
from .provenance import PACKAGE

#: the list's file name, in each folder normlab writes to
LIST = ".normlab-written.json"


def digest(path: pathlib.Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_list(folder: pathlib.Path) -> dict:
    """The folder's list as it is stored (empty where it is missing or unreadable)."""
    try:
        data = json.loads((folder / LIST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def listed(folder: pathlib.Path) -> dict[str, str]:
    """``{file name: sha256}`` of what normlab wrote in ``folder`` (empty where it wrote nothing, or the list
    cannot be read: then nothing there counts as normlab's)."""
    files = _read_list(folder).get("files", {})
    return files if isinstance(files, dict) else {}


def resolved(path) -> pathlib.Path:
    """``path`` with its links followed, or as it is (made absolute) where they loop: a loop is a link that
    exists and that normlab did not write, which ``check`` then names in one line (``Path.resolve`` raised)."""
    try:
        return pathlib.Path(path).resolve()
    except (RuntimeError, OSError):
        return pathlib.Path(os.path.abspath(path))


def check(paths, *, overwrite: bool = False, hint: str = "write into another folder") -> None:
    """Raise ``BadValue`` (one line) for the first of ``paths`` that exists and is not normlab's own unchanged
    output (with ``overwrite``, none of those), or that lies inside normlab's package (its code and shipped
    models: never an output) or is a folder (whatever ``overwrite`` says: a folder was found only when the output
    was moved into place, after all the work)."""
    paths = [pathlib.Path(os.path.abspath(q)) for q in paths]  # `out/sub/..` where sub is not made yet
    for p in paths:
        try:
            _check_one(p, overwrite, hint)
        except OSError as e:  # a name the system refuses (too long, a component that is a file): one line
            raise BadValue(f"{p}: cannot be written ({e.strerror or e}): {hint}") from None


def _check_one(p: pathlib.Path, overwrite: bool, hint: str) -> None:
    if resolved(p).is_relative_to(PACKAGE):
        raise BadValue(f"{p} is inside normlab's installed package, whose files are never replaced: {hint}")
    if p.is_dir():
        raise BadValue(f"{p} is a folder where an output would go: move it away, or {hint}")
    if overwrite or not (p.exists() or p.is_symlink()):
        return
    if p.is_file() and not p.is_symlink() and _normlabs(p, _read_list(p.parent)):
        return
    raise BadValue(f"{p} exists and normlab did not write it (or it was changed since): {hint}, move it away, "
                   "or pass --overwrite to replace it")


def writable_folder(folder, option: str = "--out") -> pathlib.Path:
    """Make ``folder`` (and its parents) and make sure a file can be written there, before any work: a
    read-only folder was found only when the first output was written, after all the measuring. BadValue (one
    line) where it cannot; returns the folder."""
    import tempfile

    folder = pathlib.Path(folder)
    if folder.is_symlink() and not folder.exists():  # mkdir said "File exists"
        raise BadValue(f"{option} {folder} is a link to {os.readlink(folder)}, which does not exist: make that "
                       f"folder, or give another {option}")
    if folder.exists() and not folder.is_dir():
        raise BadValue(f"{option} {folder} is a file, not a folder: give another {option}")
    # the first part of the path that exists must be a folder, checked before any is made: `a/../file/sub` made
    # `a` and then read "File exists"
    above = pathlib.Path(os.path.abspath(folder))
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise BadValue(f"{option} {folder}: {above} is a file, not a folder: give another {option}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise BadValue(f"{option} {folder}: cannot write there ({e.strerror or e}): give another {option}") from None
    return folder


@contextlib.contextmanager
def _list_locked(folder: pathlib.Path):
    """Hold an exclusive ``flock`` on the folder itself while its list is read, changed and replaced: two
    processes writing into one folder (``xargs -P`` over ``diarize``) each lost the other's entries, and shared
    one temporary name. Where ``fcntl`` is missing (Windows) or a folder cannot be locked, no lock."""
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system that locks no folder (NFS emulates flock with write locks): no lock
            pass
        yield
    finally:
        os.close(fd)  # the lock ends with its descriptor


def _section(data: dict, name: str) -> dict:
    part = data.get(name)
    return part if isinstance(part, dict) else {}


def _normlabs(path: pathlib.Path, data: dict) -> str | None:
    """``path``'s SHA-256 where the list holds it as normlab's (written, or about to be: a stop between the
    file's move into place and its listing left it refused as the user's); None where it is not."""
    sha = digest(path)
    return sha if sha in (_section(data, "files").get(path.name), _section(data, "pending").get(path.name)) else None


def ours(path) -> bool:
    """Whether ``path`` is a file normlab wrote and nobody changed since."""
    path = pathlib.Path(path)
    try:
        return path.is_file() and not path.is_symlink() and _normlabs(path, _read_list(path.parent)) is not None
    except OSError:
        return False


def made(path) -> dict | None:
    """What ``path`` was made from, as :func:`record` noted it (``made=``), where normlab wrote it and it is
    unchanged since; else None (not normlab's, edited since, or written without a note)."""
    path = pathlib.Path(path)
    data = _read_list(path.parent)
    note = _section(data, "made").get(path.name)
    if not isinstance(note, dict):
        return None
    try:
        if not path.is_file() or path.is_symlink() or _normlabs(path, data) != note.get("sha256"):
            return None
    except OSError:
        return None
    return {k: v for k, v in note.items() if k != "sha256"}


def _note(path: pathlib.Path, sha: str, made: dict | None, pending: bool) -> None:
    """Under the folder's lock: ``path`` listed with ``sha`` (``pending``: about to be moved into place, its
    earlier contents still normlab's), and its note (``made``) replaced."""
    with _list_locked(path.parent):
        data = _read_list(path.parent)
        files, waiting, notes = (_section(data, k) for k in ("files", "pending", "made"))
        if pending:
            waiting[path.name] = sha
        else:
            files[path.name] = sha
            waiting.pop(path.name, None)
        if made is None:
            notes.pop(path.name, None)  # the note was of the file this one replaces
        else:
            notes[path.name] = {**made, "sha256": sha}
        notes = {k: v for k, v in notes.items() if k in files or k in waiting}
        data = {"files": dict(sorted(files.items()))}
        data |= {k: dict(sorted(v.items())) for k, v in (("pending", waiting), ("made", notes)) if v}
        text = json.dumps(data, indent=1) + "\n"
        replace_whole(path.parent / LIST, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def record(path, made: dict | None = None) -> None:
    """Note in its folder's list that normlab has just written ``path`` (call after writing it); ``made``: what it
    was made from (a JSON object, read back by :func:`made`: a rerun keeps an output made from the same inputs)."""
    path = pathlib.Path(path)
    _note(path, digest(path), made, pending=False)


def write_text(path, text: str, made: dict | None = None) -> None:
    """Write ``text`` to ``path`` whole and record it (:func:`write_with`)."""
    write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), made)


def write_with(path, write: Callable[[pathlib.Path], object], made: dict | None = None) -> None:
    """:func:`replace_whole`, then recorded (with ``made``, :func:`record`'s note). The new contents are listed
    as pending before they replace the old, so a stop between the two steps leaves a file the list holds."""
    path = pathlib.Path(path)

    def staged(tmp: pathlib.Path) -> None:
        write(tmp)
        _note(path, digest(tmp), made, pending=True)

    replace_whole(path, staged)
    record(path, made)


#: free bytes under which a failed write is taken for a full disk (torch.save and libsndfile say only that the
#: write failed: "unexpected pos", "System error")
FULL_BELOW = 1 << 20


def full_disk(path, error: Exception) -> OSError | None:
    """The OSError (ENOSPC, naming ``path``) to raise for ``error``, a write of ``path`` that failed, where the
    disk it goes to is (nearly) full; None where it is not, or cannot be asked (then ``error`` stands)."""
    import errno
    import shutil

    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return None  # says it already
    try:
        free = shutil.disk_usage(pathlib.Path(path).parent).free
    except OSError:
        return None
    if free >= FULL_BELOW:
        return None
    return OSError(errno.ENOSPC, f"No space left on device ({free} bytes free)", str(path))


@contextlib.contextmanager
def full_disk_said(path, tmp: pathlib.Path):
    """``with full_disk_said(path, tmp): write tmp``: a write that fails removes ``tmp`` and, where the disk is
    full (:func:`full_disk`), is raised as the OSError that says so, naming ``path``."""
    try:
        yield
    except (RuntimeError, OSError) as e:
        tmp.unlink(missing_ok=True)
        full = full_disk(path, e)
        if full is None and _names_no_file(e, tmp):  # a full disk that says so without a name: it names path
            raise OSError(e.errno, e.strerror, str(path)) from e
        if full is None:
            raise
        raise full from e


def _names_no_file(error: Exception, tmp: pathlib.Path) -> bool:
    """Whether ``error`` is a full disk's OSError naming no file, or only the temporary (a write's flush on
    close: "cannot write its output", the command's message for its standard output)."""
    import errno

    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT) and \
        error.filename in (None, str(tmp))


#: the longest file name (bytes) most file systems take (ext4, XFS, btrfs, tmpfs; NAME_MAX)
NAME_MAX = 255


def name_bytes(name: str) -> bytes:
    """A file name as the file system holds it (its length is what :data:`NAME_MAX` bounds)."""
    return name.encode("utf-8", "surrogateescape")


def temporary(path, tag: object = "") -> pathlib.Path:
    """A temporary file's name beside ``path``: ``.NAME.TAG.tmp``, or ``.SHA.TAG.tmp`` (a digest of the name)
    where that would be longer than a file name may be (a 245-character recording's output refused as "File
    name too long", when the output's own name fitted)."""
    path = pathlib.Path(path)
    suffix = f".{tag}.tmp" if tag != "" else ".tmp"
    name = f".{path.name}{suffix}"
    if len(name_bytes(name)) > NAME_MAX:
        name = f".{hashlib.sha256(name_bytes(path.name)).hexdigest()[:32]}{suffix}"
    return path.with_name(name)


def replace_whole(path, write: Callable[[pathlib.Path], object]) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, renamed over it (a kill mid-write leaves the old
    file, not half a new one that the next run would take for the user's)."""
    path = pathlib.Path(path)
    if path.is_symlink():  # never write through a link into a file elsewhere
        path.unlink()
    tmp = temporary(path, os.getpid())
    try:
        with full_disk_said(path, tmp):  # torch.save says "unexpected pos" on a full disk, libsndfile "System error"
            write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
