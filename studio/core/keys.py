"""Declaring a setting: one key of the project file, where the stage that reads it declares it.

A stage's settings are one class (:class:`StageSettings`) in its declaration module
(``studio/core/stages/<stage>.py``); each attribute is a :class:`Key`: the dotted project
key (``quantization.scheme``), its type (the annotation), its default, a one-line doc and
its range or choices (:func:`setting`), and for a key that names an input file what kind of
file (``ref``). A key that several stages read is declared once, by the stage that owns it,
and the others take the same object (``scheme = QuantizeSettings.scheme``): the type, the
default and the range live in one place. Shared groups of keys are mixin classes
(:class:`studio.core.stages.quantize.Recipe`, ...), each key still declared once.

The project file's sections (:mod:`studio.core.settings`) are assembled from these keys; a
stage's artifact key hashes exactly the keys of its class
(:attr:`studio.core.stagedecl.StageDecl.settings`), and the stage reads them from an instance
of its class (``s = QuantizeSettings.of(ctx.config)``; ``s.scheme``), built from the
job's frozen config. Pure: no I/O, no heavy imports.
"""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

from studio.core.errors import StudioError

#: the longest context (and so prompt, generation, window) an export takes
MAX_CONTEXT = 4096
#: a sanity cap for counts of held-out / calibration tokens and samples
MAX_TOKENS = 1_000_000
#: the largest dimension of a static input shape (graph.shapes)
MAX_DIM = 1 << 20


# ---- declaring a setting ----------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What a setting allows besides its type. ``min`` / ``above`` / ``max`` are its range
    (``above``: strictly more than); ``cap`` is a limit of the machine, named only when a value
    passes it; ``choices`` a closed set (or a function giving it, for sets that live
    elsewhere); ``hint`` what the value means, appended to the error."""

    doc: str
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None
    min: float | None = None
    above: float | None = None
    max: float | None = None
    cap: float | None = None
    required: bool = False
    hint: str = ""

    def allowed(self) -> tuple[Any, ...] | None:
        return self.choices() if callable(self.choices) else self.choices


class Key:
    """One setting: its dotted project key, its type (the annotation of the class that
    declares it), its default and :class:`Spec`, and ``ref`` (the kind of input file it
    names: hashed by content, checked by preflight; "" for a plain value).

    On a class it is a descriptor: an instance reads the key's value (a section its item, a
    stage's settings the job's value). The same object on several classes is one
    declaration; the first class that annotates it declares its type."""

    def __init__(self, key: str, default: Any, spec: Spec,
                 factory: Callable[[], Any] | None = None, ref: str = "") -> None:
        self.key, self._default, self._factory, self.spec, self.ref = (
            key, default, factory, spec, ref)
        section, _, leaf = key.rpartition(".")
        self.section, self.name = section, leaf  # section "" for a top-level key
        self.type: Any = None  # the annotation, resolved by the declaring class
        self.owner = ""  # the class that declares it

    def default(self) -> Any:
        """The value where the file leaves the key out (a fresh copy)."""
        return self._factory() if self._factory else copy.deepcopy(self._default)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return obj.read_key(self)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.write_key(self, value)

    def __repr__(self) -> str:
        return f"Key({self.key!r})"


def setting(key: str, default: Any, doc: str, *, factory: Callable[[], Any] | None = None,
            ref: str = "", **limits: Any) -> Any:
    """A setting: its dotted key, its default (or a ``factory`` making it), a one-line doc,
    ``ref`` for a key naming an input file, and its limits (see :class:`Spec`). Its type is
    the annotation it is assigned to."""
    return Key(key, default, Spec(doc, **limits), factory, ref)


def project_key(key: str) -> Any:
    """A top-level key of the project file (``name``, ``targets``): declared (its type,
    default and checks) by :class:`studio.core.project.Project`; a stage that reads it
    declares it with this."""
    return Key(key, None, Spec(f"the project's {key} (studio.core.project)"))


def declare_keys(cls: type) -> dict[str, Key]:
    """The keys of ``cls`` by attribute name, its bases' first (in their order): the keys a
    class defines here take their type from its annotations (the first class that annotates
    a key declares it; another that annotates it must agree)."""
    hints = typing.get_type_hints(cls)
    own = vars(cls).get("__annotations__", {})
    for name, key in vars(cls).items():
        if not isinstance(key, Key):
            continue
        if name in own:
            if key.type is None:
                key.type, key.owner = hints[name], cls.__qualname__
            elif key.type != hints[name]:
                raise ValueError(f"{cls.__qualname__}.{name} annotates {key.key} as "
                                 f"{hints[name]}, declared {key.type} by {key.owner}")
        elif key.type is None:
            raise ValueError(f"{cls.__qualname__}.{name}: {key.key} has no type (annotate it "
                             "where it is declared)")
    keys: dict[str, Key] = {}
    for klass in reversed(cls.__mro__):
        keys.update({n: k for n, k in vars(klass).items() if isinstance(k, Key)})
    return keys


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is float:
        return "int or float"
    return getattr(origin, "__name__", str(origin))


def check_type(where: str, value: Any, hint: Any) -> None:
    """A one-line error unless ``value`` is of the declared type (elements included)."""
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):  # e.g. int | str: one of the arms
        for arm in typing.get_args(hint):
            try:
                check_type(where, value, arm)
                return
            except StudioError:
                continue
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {type(value).__name__} "
                          f"{short_repr(value)}")
    want: tuple[type, ...] = (int, float) if hint is float else (origin,)
    if isinstance(value, bool) and bool not in want:
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {value!r}")
    if not isinstance(value, want):
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {type(value).__name__} "
                          f"{short_repr(value)}")
    args, held = typing.get_args(hint), typing.cast(Any, value)
    if origin is list and args:
        for i, item in enumerate(held):
            check_type(f"{where}[{i}]", item, args[0])
    elif origin is dict and args:
        for key, item in held.items():
            check_type(f"{where}[{key!r}]", item, args[1])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range_text(spec: Spec) -> str:
    if spec.above is not None:
        low = f"above {_num(spec.above)}"
        return low + (f" and at most {_num(spec.max)}" if spec.max is not None else "")
    if spec.min is not None and spec.max is not None:
        return f"between {_num(spec.min)} and {_num(spec.max)}"
    if spec.max is not None:
        return f"at most {_num(spec.max)}"
    return "0 or more" if spec.min == 0 else f"at least {_num(spec.min or 0)}"


def check_value(where: str, value: Any, spec: Spec) -> None:
    """A one-line error unless ``value`` (of the declared type) is within ``spec``."""
    hint = f" {spec.hint}" if spec.hint else ""
    if isinstance(value, float) and not math.isfinite(value):
        raise StudioError(f"{where} must be a finite number, not {value}")
    allowed = spec.allowed()
    if allowed is not None and value not in allowed:
        shown = ", ".join(str(c) for c in allowed if c != "")
        raise StudioError(f"{where} = {short_repr(value)} is not one of {shown}{hint}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low_ok = ((spec.min is None or value >= spec.min)
                  and (spec.above is None or value > spec.above))
        if not low_ok or (spec.max is not None and value > spec.max):
            raise StudioError(f"{where} must be {_range_text(spec)}, not {value}{hint}")
        if spec.cap is not None and value > spec.cap:
            raise StudioError(f"{where} = {value} is more than this studio takes (at most "
                              f"{_num(spec.cap)}){hint}")


# ---- a stage's settings -----------------------------------------------------------------------
class InputFile(str):
    """The value of a setting that names an input file (as the project file writes it), with
    the file or folder it resolves to (``path``; None for an empty reference)."""

    path: Path | None

    def __new__(cls, value: str, path: str | None) -> InputFile:
        out = super().__new__(cls, value)
        out.path = Path(path) if path else None
        return out


class ConfigLike(Protocol):
    """What a stage's settings are built from (:class:`studio.core.stagegraph.StageConfig`)."""

    @property
    def settings(self) -> Mapping[str, Any]: ...

    @property
    def paths(self) -> Mapping[str, str]: ...


class StageSettings:
    """A stage's settings: one :class:`Key` per attribute (declared with :func:`setting`,
    or another stage's key taken as it is), read-only, typed. Built from the job's frozen
    config with :meth:`of`; a mixin of shared keys is a subclass the stages' classes extend.
    """

    _keys: ClassVar[dict[str, Key]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._keys = declare_keys(cls)

    def __init__(self, values: Mapping[str, Any], paths: Mapping[str, str] | None = None):
        missing = [k.key for k in self._keys.values() if k.key not in values]
        if missing:
            raise StudioError(f"{type(self).__name__} reads {missing[0]!r}, which the stage's "
                              "config does not hold: declare it in the stage's settings class")
        paths = paths or {}
        self._values = {k.key: (InputFile(values[k.key], paths.get(k.key)) if k.ref
                                else values[k.key]) for k in self._keys.values()}

    @classmethod
    def of(cls, config: ConfigLike) -> Self:
        """The settings of a job (its frozen config holds exactly its stage's keys)."""
        return cls(config.settings, config.paths)

    @classmethod
    def keys(cls) -> Iterator[Key]:
        """The class's keys, its bases' first."""
        return iter(cls._keys.values())

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The dotted keys of the class, in order (what a stage's artifact key hashes)."""
        return tuple(dict.fromkeys(k.key for k in cls._keys.values()))

    def read_key(self, key: Key) -> Any:
        return self._values[key.key]

    def write_key(self, key: Key, value: Any) -> None:
        raise AttributeError(f"a stage's settings are read-only ({key.key})")

    @staticmethod
    def path(value: str) -> Path:
        """The file or folder a file setting's value names (``s.path(s.calibration_text)``);
        one line for an empty reference."""
        where = value.path if isinstance(value, InputFile) else None
        if where is None:
            raise StudioError(f"{value!r} names no input file: the setting is empty or is not "
                              "a file setting")
        return where

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"
