"""Names a package exports but imports on first use (PEP 562's module `__getattr__`).

Every rank process imports pycollective, and a test run starts many hundreds of them: a
module most jobs never use (the etcd client, and http.client and email under it) is loaded
only when a name of it is first read. A package declares them in one literal table at
module level,

    _LAZY = {"EtcdStore": "pycollective.store.etcd:EtcdStore",   # an attribute
             "etcd": "pycollective.store.etcd"}                   # a module

    __getattr__, __dir__ = _lazy.attach(__name__, _LAZY)

and tests/test_layers.py reads that table as imports of the package (the layers and the
cycle check see them exactly as they see `import` statements); tests/test_lazy_imports.py
checks that `import pycollective` leaves them out and that every lazy name resolves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def _split(target: str) -> tuple[str, str | None]:
    module, _, attr = target.partition(":")
    return module, attr or None


def attach(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of module `package` for the lazy names of `table`
    (name -> "module" or "module:attribute"). A name, once read, is set on the module, so
    the import runs once and later reads are plain attribute reads."""

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attr = _split(target)
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__


def if_loaded(package: Any, name: str) -> Any:
    """The lazy attribute `name` of `package` if its module is already imported, else None
    (an isinstance check against a class nobody has imported yet is False anyway, and
    must not import it)."""
    if name in vars(package):
        return vars(package)[name]
    target = package._LAZY[name]
    module_name, attr = _split(target)
    module = sys.modules.get(module_name)
    if module is None:
        return None
    return module if attr is None else getattr(module, attr)
