"""Option records that fail at construction: a misspelt keyword is named with the valid ones (torch-free)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from typing import Any, TypeVar

__all__ = ["changed", "check", "is_count", "is_number", "keywords", "named_keys", "spelled"]

_Record = TypeVar("_Record", bound=type)


def named_keys(cls: _Record) -> _Record:
    """Make the dataclass ``cls`` refuse an unknown keyword with a ``TypeError`` naming it and the valid keywords.

    A plain dataclass names only the bad keyword; a user who wrote ``sise=`` also needs to see ``size``.

    Example::

        @named_keys
        @dataclasses.dataclass(frozen=True, kw_only=True)
        class Options:
            size: int = 224

        Options(sise=224)  # TypeError: Options(sise=...): no such option (sise: did you mean size?); ...
    """
    names = tuple(field.name for field in dataclasses.fields(cls) if field.init)
    init = cls.__init__

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError(f"{cls.__name__} takes keywords only, e.g. {cls.__name__}({names[0]}=...); {_all(names)}")
        if unknown := [key for key in kwargs if key not in names]:
            given = ", ".join(f"{key}=..." for key in unknown)
            guesses = {key: difflib.get_close_matches(key, names, n=1) for key in unknown}
            hints = "".join(f" ({key}: did you mean {guess[0]}?)" for key, guess in guesses.items() if guess)
            raise TypeError(f"{cls.__name__}({given}): no such option{hints}; {_all(names)}")
        init(self, **kwargs)

    cls.__init__ = checked_init  # type: ignore[misc]
    return cls


def _all(names: tuple[str, ...]) -> str:
    return f"the options are {', '.join(names)}"


def check(ok: bool, record: object, name: str, rule: str) -> None:
    """Unless ``ok``: a ``ValueError`` naming the record, the field and its value, then ``rule`` (what to give)."""
    if not ok:
        raise ValueError(f"{type(record).__name__}({name}={getattr(record, name)!r}): {rule}")


def is_number(value: Any, low: float = -math.inf, *, above: bool = False) -> bool:
    """``value`` is a real number (not a bool, not NaN) at least ``low``, or above it with ``above``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return False
    return value > low if above else value >= low


def is_count(value: Any, low: int) -> bool:
    """``value`` is a whole number (not a bool) at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def keywords(record: Any) -> dict[str, Any]:
    """The record's fields as keywords, the values themselves (``dataclasses.asdict`` would deep-copy them)."""
    return {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}


def changed(record: Any) -> dict[str, Any]:
    """The fields that differ from their defaults."""
    defaults = {field.name: field.default for field in dataclasses.fields(record)}
    return {name: value for name, value in keywords(record).items() if value != defaults[name]}


def spelled(record: Any) -> str:
    """The record as one would write it: only the fields that differ from their defaults."""
    return f"{type(record).__name__}({', '.join(f'{name}={value!r}' for name, value in changed(record).items())})"
