"""The registry's lazy loading: every thread's first lookup sees every entry."""

from __future__ import annotations

import sys
import threading

import pytest


def test_a_lookup_from_another_thread_waits_for_the_package_import(tmp_path, monkeypatch):
    """Two threads look up a registry whose submodule registers after a pause: both get the
    entry (before, the second saw the package marked loaded and an empty registry)."""
    pkg = tmp_path / "slowreg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pipeline.registry import Registry\nR = Registry('thing', __name__)\n")
    (pkg / "slow.py").write_text("import time\nfrom slowreg import R\ntime.sleep(0.5)\nR.register('x', 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slowreg", raising=False)
    monkeypatch.delitem(sys.modules, "slowreg.slow", raising=False)
    from slowreg import R

    seen = []
    threads = [threading.Thread(target=lambda: seen.append(R.names())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [["x"], ["x"]]


def test_a_failed_import_is_retried_and_raises_again(tmp_path, monkeypatch):
    pkg = tmp_path / "badreg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pipeline.registry import Registry\nR = Registry('thing', __name__)\n")
    (pkg / "broken.py").write_text("raise ImportError('broken entry')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badreg", raising=False)
    from badreg import R

    for _ in range(2):  # never an empty registry that looks loaded
        with pytest.raises(ImportError, match="broken entry"):
            R.names()
