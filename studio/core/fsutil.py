"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
    from studio.core.errors import StudioError

    p = Path(path)
    while not p.exists():
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise StudioError(f"cannot write to {p}: choose a folder you can write to")


def try_flock(path: Path) -> int | None:
    """An exclusive flock on ``path`` (created if missing) without waiting: its open file
    descriptor (closing it releases the lock, and so does the process's death), or None
    when another process holds it."""
    import fcntl

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
        from studio.core.errors import StudioError

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
        import fcntl

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
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """Write a folder that appears whole or not at all: the body fills the temporary folder
    it is given (beside ``dest``); when it returns, that folder takes ``dest``'s place — an
    older ``dest`` is replaced only then, and put back if the swap fails. If the body
    raises, ``dest`` is left as it was."""
    import shutil

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    old = None
    try:
        yield tmp
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
    import shutil

    with atomic_folder(Path(dest)) as tmp:
        shutil.copytree(Path(src), tmp, dirs_exist_ok=True)
    return Path(dest)
