"""Content-addressed artifact store.

Every stage output is a folder of files under ``<project>.studio/artifacts/``. Its *key* is
the hash of what produced it (stage, config, the digests of its input artifacts, tool
versions): if that key is already stored, the stage is not run again. Its *digest* is the
hash of its content (every file's sha256) and is what downstream keys are built from, so
a change anywhere upstream propagates down the chain.

Writes are atomic: a stage writes into ``tmp/<random>/`` and the folder is renamed into
place only after ``artifact.json`` is written. A crash leaves only a ``tmp/`` folder that
the next open removes; a stored artifact is never half-written.

A stage that works part by part (a model exported or quantized in parts) writes into
``tmp/resume-<key>/`` instead, kept across a crash or a kill: run again with the same key,
it finds the parts it finished there and does only the rest (:meth:`ArtifactStore.
new_workdir`). Such a folder is removed when its key is stored, and like any other when it holds no
finished part or is older than :data:`RESUME_DAYS` days. Finished parts are also kept by
their own key in ``parts/`` (:mod:`studio.core.partcache`), so a run with other settings
takes the parts those settings do not change.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.fsutil import (
    atomic_write_json,
    link_or_copy,
    sha256_file,
    sha256_json,
    try_flock,
)
from studio.core.partcache import PartCache

META = "artifact.json"
#: the work folders of part-by-part stages, kept for a re-run with the same key
RESUME_PREFIX = "resume-"
#: a kept work folder older than this is removed when the store opens
RESUME_DAYS = 7
#: what marks a finished part in a kept work folder (``<part>/`` + this): a kept folder
#: without one holds nothing a re-run could keep, and is removed like any other
PART_DONE = ".part-done.json"


def holds_finished_parts(workdir: Path) -> bool:
    """Whether a kept work folder holds a part a re-run would keep."""
    return any(Path(workdir).glob(f"*/{PART_DONE}"))


@dataclass(frozen=True)
class Artifact:
    key: str
    path: Path
    meta: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.meta["digest"])

    @property
    def stage(self) -> str:
        return str(self.meta["stage"])

    def file(self, name: str) -> Path:
        return self.path / name


def artifact_key(stage: str, config: dict[str, Any], inputs: dict[str, str],
                 versions: dict[str, str]) -> str:
    return sha256_json({"stage": stage, "config": config, "inputs": inputs, "versions": versions})


class ArtifactStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        #: finished parts of part-by-part stages by part key (:mod:`studio.core.partcache`)
        self.parts = self.root / "parts"

    def open(self) -> ArtifactStore:
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self

    def clean_tmp(self) -> int:
        """Remove leftovers of interrupted stages (call only when no stage is running); the
        work folders of part-by-part stages stay for :data:`RESUME_DAYS` days."""
        n = 0
        if self.tmp.exists():
            old = time.time() - RESUME_DAYS * 86400
            for p in self.tmp.iterdir():
                if (p.name.startswith(RESUME_PREFIX) and p.stat().st_mtime > old
                        and holds_finished_parts(p)):
                    continue
                shutil.rmtree(p, ignore_errors=True)
                n += 1
        return n + PartCache(self.parts).prune()

    def _dir(self, key: str) -> Path:
        return self.objects / key[:2] / key

    def get(self, key: str) -> Artifact | None:
        d = self._dir(key)
        meta_file = d / META
        if not meta_file.exists():
            return None
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return Artifact(key, d, meta)

    def verify(self, art: Artifact) -> bool:
        """True when every file still has the content recorded at write time."""
        for name, digest in art.meta.get("files", {}).items():
            f = art.path / name
            if not f.exists() or sha256_file(f) != digest:
                return False
        return True

    def new_workdir(self, resume_key: str | None = None) -> Path:
        """A fresh work folder; with ``resume_key``, the key's kept folder (what an
        interrupted run of that key left, or a new one): the caller holds the key's lock."""
        if resume_key is not None:
            d = self.tmp / f"{RESUME_PREFIX}{resume_key}"
            d.mkdir(parents=True, exist_ok=True)
            os.utime(d)  # in use: not old
            return d
        d = self.tmp / uuid.uuid4().hex
        d.mkdir(parents=True)
        return d

    def drop_workdir(self, workdir: Path) -> None:
        """A job's work folder after a failure or a cancel: removed, unless it is a kept
        folder holding finished parts (the next run of its key keeps them)."""
        workdir = Path(workdir)
        if workdir.name.startswith(RESUME_PREFIX) and holds_finished_parts(workdir):
            return
        shutil.rmtree(workdir, ignore_errors=True)

    def commit(self, key: str, workdir: Path, meta: dict[str, Any]) -> Artifact:
        """Hash the files in ``workdir``, write the metadata, move the folder into place."""
        files = {
            str(p.relative_to(workdir)): sha256_file(p)
            for p in sorted(workdir.rglob("*")) if p.is_file() and p.name != META
        }
        full = dict(meta)
        full.update(key=key, files=files, digest=sha256_json(files), created=time.time())
        atomic_write_json(workdir / META, full)
        dest = self._dir(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # a stale or corrupt copy: replace it
            shutil.rmtree(dest)
        workdir.rename(dest)
        return Artifact(key, dest, full)

    def adopt(self, art: Artifact) -> Artifact:
        """Store another store's artifact ``art`` here under its key, as it is (its files and
        ``artifact.json``): hard-linked where the two stores share a file system, copied where
        they do not, and moved into place as :meth:`commit` moves a work folder (a reader never
        sees half of it). An artifact this store already holds under the key is kept."""
        have = self.get(art.key)
        if have is not None:
            return have
        work = self.new_workdir()
        for src in sorted(art.path.rglob("*")):
            if src.is_file():
                link_or_copy(src, work / src.relative_to(art.path))
        dest = self._dir(art.key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            work.rename(dest)
        except OSError:  # another writer put the key in place meanwhile: theirs stays
            shutil.rmtree(work, ignore_errors=True)
        got = self.get(art.key)
        if got is None:
            raise OSError(f"{dest}: the artifact could not be stored")
        return got

    def key_lock(self, key: str) -> KeyLock:
        """The lock one writer holds while it computes ``key`` (two runs or sweeps never
        compute the same artifact at once: the second waits and finds it stored)."""
        return KeyLock(self.root / "locks" / f"{key}.lock")

    def all(self) -> list[Artifact]:
        out = []
        if self.objects.exists():
            for meta_file in self.objects.glob(f"*/*/{META}"):
                art = self.get(meta_file.parent.name)
                if art is not None:
                    out.append(art)
        return sorted(out, key=lambda a: a.meta.get("created", 0))


class KeyLock:
    """An exclusive, non-blocking flock on one artifact key; it dies with its process."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        self._fd = try_flock(self.path)
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the file stays: unlinking it would let two writers lock two files
