"""Keyword options as frozen dataclasses: defaults and help texts a CLI can list (stdlib only)."""

from __future__ import annotations

import numbers
from dataclasses import MISSING, field, fields
from typing import Any, ClassVar

from paramserver.core.words import did_you_mean


def opt(default: Any, help: str) -> Any:
    """A dataclass field with a default and a one-line help text."""
    return field(default=default, metadata={"help": help})


def describe(options_cls: type | None) -> dict[str, tuple[Any, str]]:
    """name -> (default, help) for every field of an options dataclass, in declaration order."""
    if options_cls is None:
        return {}
    out = {}
    for f in fields(options_cls):
        default = None if f.default is MISSING else f.default
        out[f.name] = (default, f.metadata.get("help", ""))
    return out


def check_known(what: str, given, known) -> None:
    """Refuse option names `what` does not take: ValueError naming them, the ones it takes and,
    for a misspelt one, the nearest."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{what} has no option(s) {', '.join(unknown)}; its options: "
                         f"{', '.join(known) or '(none)'}{did_you_mean(unknown[0], known)}")


def check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_int(name: str, value: Any, lo: int | None = None) -> None:
    """Raise ValueError unless `value` is an int (not a bool) and >= lo."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    check_range(name, value, lo)


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                *, lo_open: bool = False) -> None:
    """Raise ValueError unless `value` is a number (not a bool) and lo <= value <= hi
    (lo < value if lo_open); NaN is in no range."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number; got {value!r}")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    if too_low or (hi is not None and value > hi) or value != value:
        lo_txt = "-inf" if lo is None else f"{lo}"
        hi_txt = "inf" if hi is None else f"{hi}"
        bracket = "(" if lo_open else "["
        raise ValueError(f"{name} must be in {bracket}{lo_txt}, {hi_txt}]; got {value!r}")


class Configurable:
    """Mixin for classes built from keyword options: `Options` names their frozen dataclass."""

    Options: ClassVar[type | None] = None

    @classmethod
    def option_help(cls) -> dict[str, tuple[Any, str]]:
        """name -> (default, help) of every keyword option the constructor takes."""
        return describe(cls.Options)


def option_help(cls: type) -> dict[str, tuple[Any, str]]:
    """Options of any registered class; {} for classes that take none (e.g. BSP, ASP)."""
    helper = getattr(cls, "option_help", None)
    return helper() if callable(helper) else {}
