"""The registry's lazy loading: every thread's first lookup sees every entry."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest


def _package(tmp_path, monkeypatch, name: str, modules: dict[str, str]):
    """A package ``name`` on the path whose ``R`` registry loads ``modules`` (name -> source)."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pipeline.registry import Registry\nR = Registry('thing', __name__)\n")
    for mod, source in modules.items():
        (pkg / f"{mod}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in (name, *(f"{name}.{m}" for m in modules)):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    return importlib.import_module(name).R


def test_a_lookup_from_another_thread_waits_for_the_package_import(tmp_path, monkeypatch):
    """Two threads look up a registry whose submodule registers after a pause: both get the
    entry; the second waits for the import and never sees an empty registry marked loaded."""
    R = _package(tmp_path, monkeypatch, "slowreg", {"slow": "import time\nfrom slowreg import R\ntime.sleep(0.5)\nR.register('x', 1)\n"})

    seen = []
    threads = [threading.Thread(target=lambda: seen.append(R.names())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [["x"], ["x"]]


def test_a_failed_import_is_retried_and_raises_again(tmp_path, monkeypatch):
    R = _package(tmp_path, monkeypatch, "badreg", {"broken": "raise ImportError('broken entry')\n"})

    for _ in range(2):  # never an empty registry that looks loaded
        with pytest.raises(ImportError, match="broken entry"):
            R.names()
