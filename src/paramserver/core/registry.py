"""Name -> class registries: the names users type on the command line map to implementations."""

from __future__ import annotations

import inspect
import re
from typing import Callable, Generic, Iterator, TypeVar

from paramserver.core.words import did_you_mean

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name that no registry entry answers to; the message lists the known ones."""


class Registry(Generic[T]):
    """A small ordered map from user-facing names to classes or factories."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self._entries) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}"
                                   f"{did_you_mean(name, self._entries)}") from None

    def create(self, name: str, *args, **options):
        """Build entry `name`; keyword options it does not take fail naming the entry."""
        factory = self.get(name)
        try:
            return factory(*args, **options)
        except TypeError as exc:
            m = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
            if m is None:
                raise ValueError(f"bad options for {self.kind} {name!r}: {exc}") from None
            fields = getattr(getattr(factory, "Options", None), "__dataclass_fields__", None)
            # (what the caller always passes, such as batch_size or lr, is no user option)
            known = set(fields) if fields else \
                _keywords(factory) - set(_positional(args, factory)) - (set(options) - {m[1]})
            raise ValueError(f"{self.kind} {name!r} has no option {m[1]!r}; its options: "
                             f"{', '.join(sorted(known)) or '(none)'}"
                             f"{did_you_mean(m[1], known)}") from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


def _keywords(factory) -> set[str]:
    """The keyword options a class or function takes (its __init__'s for a class)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return set()
    return {p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}


def _positional(args: tuple, factory) -> list[str]:
    """The names the positional `args` already filled."""
    try:
        params = list(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return []
    return params[:len(args)]
