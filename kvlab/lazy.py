"""A package's names imported on first use (PEP 562): ``kvlab.mem_cache`` and ``kvlab.sched`` re-export names from
their modules without importing those modules (and torch) when one light module of the package is imported."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]],
                 namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``exports`` maps a module to the names the package re-exports
    from it; a name is imported from its module on first use and then kept in the package's ``namespace``; any
    other name is tried as a submodule (as an eager package has them all)."""
    homes = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            try:
                return import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
