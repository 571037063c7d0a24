"""A tiny name -> factory registry, shared by every extensible axis (timm style).

A registry is read in one screen: ``register`` (decorator), ``names``, ``get``/``create``,
``check_known``. Lookups of unknown names raise ``KeyError`` listing the valid ones.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown registry key; the message lists the valid keys."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps kebab-case names to objects (factories or descriptors).

    Args:
        kind: what the registry holds, used in error messages ("scorer", "suite").
        package: dotted package whose submodules register entries on import; imported
            lazily on the first lookup so that registration needs no central list.
    """

    def __init__(self, kind: str, package: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self._entries: dict[str, T] = {}
        self._loaded = package is None
        self._loading = False  # this registry's package is being imported (by the lock's holder)
        self._lock = threading.RLock()

    def register(self, name: str, obj: T | None = None) -> Any:
        """Register ``obj`` under ``name``; usable as ``@registry.register("name")``."""

        def add(o: T) -> T:
            if name in self._entries and self._entries[name] is not o:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = o
            return o

        return add(obj) if obj is not None else add

    def _load(self) -> None:
        """Import the package's submodules once. Another thread's lookup waits until every
        entry is registered (a multi-threaded dask worker scores in several threads); a
        lookup made while the submodules import (by the importing thread) sees the
        entries registered so far."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                pkg = importlib.import_module(self.package)
                for mod in pkgutil.iter_modules(pkg.__path__):
                    if not mod.name.startswith("_"):
                        importlib.import_module(f"{self.package}.{mod.name}")
                self._loaded = True
            finally:
                self._loading = False

    def names(self) -> list[str]:
        """All registered names, sorted."""
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry for ``name``; unknown names raise with the valid alternatives."""
        self._load()
        if name not in self._entries:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            )
        return self._entries[name]

    def check_known(self, names, key: str) -> None:
        """Refuse the names of ``names`` that are not registered, in one line naming ``key``
        (where they come from, e.g. ``score.seed_variants``) and the valid alternatives: a list a
        config filters by name would otherwise drop a misspelt entry in silence."""
        self._load()
        unknown = sorted(set(names) - set(self._entries))
        if unknown:
            raise UnknownNameError(
                f"{key} names unknown {self.kind}(s) {', '.join(unknown)}; valid {self.kind}s: {', '.join(self.names())}"
            )

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

