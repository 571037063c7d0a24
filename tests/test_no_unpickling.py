"""No code in the package unpickles a file: every ``.py`` under ``pipeline/`` and ``stages/``
is parsed (``ast``, so comments, strings and docstrings do not count) and refused if it
imports a pickle module, calls ``torch.load`` without a literal ``weights_only=True``, calls
``np.load`` with ``allow_pickle`` other than a literal False, or calls ``pd.read_pickle``.
Aliases (``import torch as th``, ``from torch import load``) resolve to the full name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("pipeline", "stages")
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
NUMPY_LOADS = {"numpy.load"}
PANDAS_PICKLE = {"pandas.read_pickle", "pandas.io.pickle.read_pickle"}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _keyword_is(call: ast.Call, name: str, value: object) -> bool | None:
    """True/False when ``name=`` is given as a literal equal/unequal to ``value``; None when
    absent; False when given as a non-literal or possibly through ``**kwargs``."""
    for kw in call.keywords:
        if kw.arg == name:
            return isinstance(kw.value, ast.Constant) and kw.value.value is value
    return False if any(kw.arg is None for kw in call.keywords) else None


def unpickling_calls(source: str, filename: str = "<string>") -> list[str]:
    """Every way ``source`` may unpickle data, as ``file:line: what`` strings."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}  # local name -> the full dotted name it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in PICKLE_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in PICKLE_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is None:
            continue
        head, _, rest = name.partition(".")
        full = ".".join(filter(None, [aliases.get(head, head), rest]))
        full = full.replace("np.", "numpy.", 1) if full.startswith("np.") else full
        full = full.replace("pd.", "pandas.", 1) if full.startswith("pd.") else full
        if full in TORCH_LOADS and _keyword_is(node, "weights_only", True) is not True:
            found.append(f"{filename}:{node.lineno}: {full} without weights_only=True")
        elif full in NUMPY_LOADS and _keyword_is(node, "allow_pickle", False) is False:
            found.append(f"{filename}:{node.lineno}: {full} with allow_pickle")
        elif full in PANDAS_PICKLE:
            found.append(f"{filename}:{node.lineno}: {full}")
    return found


def _package_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_the_package_unpickles_nothing():
    files = _package_files()
    assert len(files) > 50 and any(p.name == "toyclip.py" for p in files)  # the scan sees the package
    found = [hit for p in files for hit in unpickling_calls(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "unpickling in the package:\n" + "\n".join(found)


BAD = {
    "import pickle": "import pickle",
    "import dill as d": "import dill",
    "from pickle import loads": "from pickle import",
    "import torch\ntorch.load('r.pt')": "torch.load without",
    "import torch\ntorch.load('r.pt', weights_only=False)": "torch.load without",
    "import torch\nkw = {}\ntorch.load('r.pt', **kw)": "torch.load without",
    "import torch as th\nth.load('r.pt', map_location='cpu')": "torch.load without",
    "from torch import load\nload('r.pt')": "torch.load without",
    "import torch.serialization\ntorch.serialization.load('r.pt')": "torch.serialization.load",
    "import numpy as np\nnp.load('a.npy', allow_pickle=True)": "numpy.load with allow_pickle",
    "import numpy\nnumpy.load('a.npz', allow_pickle=flag)": "numpy.load with allow_pickle",
    "import pandas as pd\npd.read_pickle('a.pkl')": "pandas.read_pickle",
    "from pandas import read_pickle\nread_pickle('a.pkl')": "pandas.read_pickle",
}
GOOD = [
    "import torch\ntorch.load('r.pt', map_location='cpu', weights_only=True)",
    "import numpy as np\nnp.load('a.npy')\nnp.load('b.npy', allow_pickle=False)",
    "import pandas as pd\npd.read_parquet('a.parquet')\ndf.to_pickle  # not called",
    "'''torch.load(x) and import pickle in a docstring'''\n# import pickle",
    "from safetensors.torch import load_file\nload_file('m.safetensors')",
]


@pytest.mark.parametrize("source", list(BAD))
def test_the_checker_finds_each_kind_of_unpickling(source):
    (hit,) = unpickling_calls(source)
    assert BAD[source] in hit


@pytest.mark.parametrize("source", GOOD)
def test_the_checker_passes_safe_loads(source):
    assert unpickling_calls(source) == []


def test_the_checker_fails_the_scan_on_a_bad_file(tmp_path):
    bad = tmp_path / "resume.py"
    bad.write_text("import torch\n\ndef resume(p):\n    return torch.load(p, weights_only=False)\n")
    assert unpickling_calls(bad.read_text(), "resume.py") == ["resume.py:4: torch.load without weights_only=True"]
