"""Name -> class registries: the names users type on the command line map to implementations."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

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
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def create(self, name: str, *args, **options):
        """Build entry `name`; keyword options it does not take fail naming the entry."""
        factory = self.get(name)
        try:
            return factory(*args, **options)
        except TypeError as exc:
            raise ValueError(f"bad options for {self.kind} {name!r}: {exc}") from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
