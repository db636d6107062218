"""The names the QNN EP gives compiled graphs, predicted from the model file's path.

ONNX Runtime names a graph it hands to an execution provider from a hash of the model file's
path: MurmurHash3 (x86, 128 bits, seed 0) of the path's UTF-8 bytes, the first 64 bits as a
decimal number (its metadef id generator); the QNN EP's graph is then
``QNNExecutionProvider_QNNExecutionProvider_<hash>_1_0``. Measured: the prediction equals the
name in the compiled context model for every file compiled so far (the 8 B shape's parts
included). Genie takes the graphs of a split bundle in the order of their names, so the
compile stage chooses the file name a part is compiled from by this prediction (one compile)
instead of compiling under file name after file name until one sorts right.

Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

#: the prefix of the QNN EP's graph names
QNN_PREFIX = "QNNExecutionProvider_QNNExecutionProvider_"
_M = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M
    return h ^ (h >> 16)


_C = (0x239B961B, 0xAB0E9789, 0x38B34AE5, 0xA1E38B93)
_R = (15, 16, 17, 18)  # the k rotations
_H = ((19, 0x561CCD1B), (17, 0x0BCAA747), (15, 0x96CD1C35), (13, 0x32AC3B17))


def murmur3_x86_128(data: bytes, seed: int = 0) -> tuple[int, int, int, int]:
    """MurmurHash3_x86_128 of ``data``: its four 32-bit words."""
    n = len(data)
    h = [seed] * 4

    def mix_k(j: int, k: int) -> int:
        k = (k * _C[j]) & _M
        k = _rotl(k, _R[j])
        return (k * _C[(j + 1) % 4]) & _M

    for i in range(n // 16):
        block = data[16 * i:16 * i + 16]
        for j in range(4):
            h[j] ^= mix_k(j, int.from_bytes(block[4 * j:4 * j + 4], "little"))
            rot, add = _H[j]
            h[j] = _rotl(h[j], rot)
            h[j] = (h[j] + h[(j + 1) % 4]) & _M
            h[j] = (h[j] * 5 + add) & _M
    tail = data[16 * (n // 16):]
    for j in range(3, -1, -1):
        chunk = tail[4 * j:4 * j + 4]
        if chunk:
            h[j] ^= mix_k(j, int.from_bytes(chunk, "little"))
    h = [x ^ n for x in h]

    def spread(h: list[int]) -> list[int]:
        h[0] = (h[0] + h[1] + h[2] + h[3]) & _M
        return [h[0]] + [(x + h[0]) & _M for x in h[1:]]

    h = spread(h)
    h = spread([_fmix(x) for x in h])
    return h[0], h[1], h[2], h[3]


def graph_name(model_path: str | Path) -> str:
    """The QNN EP's name for the graph compiled from the model file at ``model_path`` (as the
    compile passes it to ONNX Runtime)."""
    h = murmur3_x86_128(str(model_path).encode("utf-8"))
    return f"{QNN_PREFIX}{h[0] | (h[1] << 32)}_1_0"


def hash_of(name: str) -> int:
    """The hash in a QNN EP graph name (``…_<hash>_1_0``)."""
    return int(name[len(QNN_PREFIX):].split("_")[0])


def in_order(name: str, after: str) -> bool:
    """Whether a part's graph named ``name`` may follow the part before it (``after``; ""
    for the first part, whose hash must start with 1 to leave the others room)."""
    first_ok = bool(after) or not name.startswith(QNN_PREFIX) or \
        name[len(QNN_PREFIX):][:1] == "1"
    return name > after and first_ok


def place(name: str) -> float:
    """Where a graph name falls in the order Genie takes names (string order), from 0 to 1:
    its hash's digits read as a decimal fraction. (A hash's magnitude is not its place:
    ``91189191780931875`` is a small number and sorts after ``18…`` of any length.)"""
    return float("0." + name[len(QNN_PREFIX):].split("_")[0])


def pick(paths_of: Callable[[int], Mapping[K, Path]], after: Mapping[K, str],
         candidates: int = 4096) -> int | None:
    """Of the candidates ``0 … candidates - 1``, the one whose graphs (``paths_of(i)``: graph
    -> the file it is compiled from) get predicted names that all sort after ``after``'s and
    use the least of the room left (the smallest sum of :func:`place`), so that the parts
    after it find names too; None when none fits."""
    best: tuple[float, int] | None = None
    for i in range(candidates):
        names = {g: graph_name(p) for g, p in paths_of(i).items()}
        if all(in_order(names[g], after[g]) for g in names):
            used = sum(place(n) for n in names.values())
            if best is None or used < best[0]:
                best = (used, i)
    return best[1] if best is not None else None
