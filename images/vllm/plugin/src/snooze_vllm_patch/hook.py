"""Runs a callback right after a named module is imported, so patching never imports it early."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

Callback = Callable[[ModuleType], object]


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder that lets the other finders find one module, then calls back after its load."""

    def __init__(self, fullname: str, callback: Callback) -> None:
        self.fullname = fullname
        self.callback = callback

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != self.fullname:
            return None
        for finder in list(sys.meta_path):
            if isinstance(finder, _AfterImport):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec: ModuleSpec | None = find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenCall(spec.loader, self)
            return spec
        return None


class _ThenCall(importlib.abc.Loader):
    """Delegates loading to the real loader, then runs the finder's callback once."""

    def __init__(self, loader: importlib.abc.Loader, finder: _AfterImport) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader: inspect, linecache and reload ask it for source.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        # Only after a successful load: if the import fails, a later retry still patches.
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder.callback(module)


def when_imported(fullname: str, callback: Callback) -> bool:
    """Call `callback(module)` now if `fullname` is imported, else right after its import.

    Returns True when the callback ran now. At most one deferred callback is kept per module
    name, so calling this again before the import does not stack callbacks.
    """
    module = sys.modules.get(fullname)
    if module is not None:
        callback(module)
        return True
    pending = any(
        isinstance(finder, _AfterImport) and finder.fullname == fullname for finder in sys.meta_path
    )
    if not pending:
        # First place: the standard finders would otherwise find the module before us.
        sys.meta_path.insert(0, _AfterImport(fullname, callback))
    return False
