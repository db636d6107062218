"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every write goes through :func:`check_output` first: a path is written only when it is
missing, a regular file (a file is expected) or a folder (a folder is expected). A symbolic
link, a device, a FIFO or a socket is refused in one line, never replaced: ``--out /dev/null``
or a link into someone else's files is left as it is. (The convention for links: refused, not
written through.) The temporary file or folder is made in the target's own folder, so the
final rename never crosses a file system. Reading has its bounded counterpart,
:func:`read_input`: a regular file only, checked for size before it is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError

#: the files the studio reads as images (a vision-language model's pictures, through Pillow)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"))


def kind_of(mode: int) -> str:
    """What an ``st_mode`` says a path is, in words (``a symbolic link``, ``a FIFO``...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_output(path: Path | str, *, folder: bool = False, marker: str | None = None) -> Path:
    """Refuse, in one line (:class:`StudioError`, exit 2), to write ``path`` unless it is
    missing or of the kind expected: a regular file (``folder=False``) or a folder
    (``folder=True``). A symbolic link (even to a regular file), a device, a FIFO or a socket
    is refused, and so is a parent that is a file. ``marker``, for a folder that a writer
    replaces whole: an existing, non-empty folder is taken only when it holds that file (the
    writer's own earlier output); ``""``: only an empty one. Returns ``path``."""
    path = Path(path)
    want = "folder" if folder else "file"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise StudioError(f"cannot write {path}: a folder on its path is a file") from None
    except OSError as exc:
        raise StudioError(f"cannot write {path}: {exc.strerror or exc}") from None
    mode = st.st_mode
    if stat.S_ISREG(mode) and not folder:
        return path
    if stat.S_ISDIR(mode) and folder:
        if marker is not None:
            try:
                entries = [e.name for e in os.scandir(path)]
            except OSError as exc:
                raise StudioError(f"cannot write {path}: {exc.strerror or exc}") from None
            if entries and (not marker or marker not in entries):
                raise StudioError(f"{path} is a folder that holds other files: give a new "
                                  "folder (nothing was written)")
        return path
    if stat.S_ISDIR(mode):
        raise StudioError(f"{path} is a folder: give a file name (nothing was written)")
    if stat.S_ISREG(mode):
        raise StudioError(f"{path} is a file, not a folder: give a folder (nothing was "
                          "written)")
    raise StudioError(f"{path} is {kind_of(mode)}, not a regular {want}: QStudio writes only "
                      f"a new path or a {want} it may replace (nothing was written)")


def check_destination(path: Path | str, *, folder: bool = False,
                      marker: str | None = None) -> Path:
    """The one rule for a path a user gives the studio to write (an ``--out`` file or folder,
    an export, a new project file), for every writer: the folder it goes in must exist and be
    writable (the studio never makes a user's folders: a mistyped one is not created, the
    writer refuses it in one line naming it), and the path itself is one :func:`check_output`
    takes. A :class:`StudioError` (exit 2) before any work; returns ``path``."""
    path = check_output(Path(path), folder=folder, marker=marker)
    parent = Path(os.path.abspath(path)).parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise StudioError(f"cannot write {path}: the folder {parent} does not exist: create it "
                          "first, or give a path in a folder that exists (nothing was "
                          "written)") from None
    except NotADirectoryError:
        raise StudioError(f"cannot write {path}: a folder on its path is a file") from None
    except OSError as exc:
        raise StudioError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StudioError(f"cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StudioError(f"cannot write {path}: the folder {parent} is not writable: choose "
                          "a folder you can write to (nothing was written)")
    return path


def read_input(path: Path | str, limit: int, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file (a link to one is fine) of at most ``limit``
    bytes; anything else is refused in one line before a byte is read (a FIFO, a device such
    as ``/dev/zero``, a folder, an oversized file). Opened without blocking, so a FIFO never
    hangs the caller; the kind and size are those of the file opened (``fstat``)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise StudioError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise StudioError(f"{what} {path} is a folder, not a file") from None
    except OSError as exc:
        raise StudioError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StudioError(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise StudioError(f"{what} {path} is {st.st_size:,} bytes; at most {limit:,} are "
                              "read: is it the right file?")
        chunks, left = [], limit + 1
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew while we read
            raise StudioError(f"{what} {path} is more than {limit:,} bytes: is it the right "
                              "file?")
        return data
    except OSError as exc:
        raise StudioError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


#: how deep tables and lists of an input (a project file, a JSON body) may nest: the
#: project file needs 4 levels ([[sweeps]] -> axes -> values -> a table of overrides)
MAX_NESTING = 32


def check_nesting(obj: Any, what: str, limit: int = MAX_NESTING) -> None:
    """A one-line error when ``obj`` (parsed TOML or JSON) nests lists and tables more than
    ``limit`` deep; iterative, so the check itself never recurses."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise StudioError(f"{what} nests tables or lists more than {limit} deep")
        stack.extend((c, depth + 1) for c in children)


def parse_json(data: bytes, what: str, limit: int = MAX_NESTING) -> Any:
    """JSON from bytes: UTF-8 text, well-formed, nested at most ``limit`` deep, or a one-line
    error (never a RecursionError or a decoding traceback)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise StudioError(f"{what} is not UTF-8 text") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise StudioError(f"{what} nests too deeply") from None
    except ValueError as exc:
        raise StudioError(f"{what} is not valid JSON ({exc})") from None
    check_nesting(obj, what, limit)
    return obj


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (see :func:`check_output`) through a temporary file in the
    same folder and one rename."""
    path = check_output(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        check_output(path)  # again, just before the rename: nothing has been put there since
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def stat_key(path: Path) -> tuple[str, int, int, int]:
    """What a file is on disk now, for a value cached by file (its resolved path, inode, size
    and modification time): a file written in place or replaced gets another key."""
    st = os.stat(path)
    return (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def check_writable_dir(path: Path) -> None:
    """Raise StudioError unless ``path`` (or its nearest existing parent) is writable."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise StudioError(f"cannot write to {p}: choose a folder you can write to")


def try_flock(path: Path) -> int | None:
    """An exclusive flock on ``path`` (created if missing) without waiting: its open file
    descriptor (closing it releases the lock, and so does the process's death), or None
    when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class RunLock:
    """An exclusive, non-blocking lock on a project folder for the length of a pipeline run.

    Two runs writing the same artifacts at once would race; the second gets a clear error.
    The lock dies with its process (flock), so a killed run never leaves it behind.
    """

    def __init__(self, folder: Path):
        self.path = Path(folder) / "run.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = try_flock(self.path)
        if fd is None:
            try:
                holder = self.path.read_text(errors="replace").strip()[:32] or "?"
            except OSError:
                holder = "?"
            raise StudioError(
                f"another pipeline run (process {holder}) is using {self.path.parent.name}: "
                "wait for it to finish or cancel it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def held(self) -> bool:
        """Whether some process holds the lock now (a pipeline run is going)."""
        if self._fd is not None:
            return True
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a shared lock we may have taken
        return False

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """Write a folder that appears whole or not at all: the body fills the temporary folder
    it is given (beside ``dest``); when it returns, that folder takes ``dest``'s place — an
    older ``dest`` is replaced only then, and put back if the swap fails. If the body
    raises, ``dest`` is left as it was."""
    dest = check_output(Path(dest), folder=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    old = None
    try:
        yield tmp
        check_output(dest, folder=True)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not dest.exists():
            os.replace(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_copytree(src: Path, dest: Path) -> Path:
    """Copy folder ``src`` to ``dest`` so that ``dest`` appears whole or not at all (see
    :func:`atomic_folder`)."""
    with atomic_folder(Path(dest)) as tmp:
        shutil.copytree(Path(src), tmp, dirs_exist_ok=True)
    return Path(dest)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (no second copy on disk), or a copy where a link
    cannot be made (another file system). Only for files nobody rewrites in place: the
    studio's writers always replace a file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
