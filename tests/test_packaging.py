"""The installed package holds every file the library reads at run time: each non-Python
file under ``pipeline/`` (configs, templates, a family's report text, benchmark data)
matches a ``[tool.setuptools.package-data]`` glob of its package in ``pyproject.toml``, so
a wheel (a non-editable install) is not missing one."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def packaged(path: Path, package_data: dict[str, list[str]]) -> bool:
    """Whether ``path`` (under ROOT) matches a glob of the package that holds it, or of one
    above it (a glob may name a subfolder: ``configs/*.json``)."""
    rel = path.relative_to(ROOT)
    for i in range(1, len(rel.parts)):
        package, inner = ".".join(rel.parts[:i]), "/".join(rel.parts[i:])
        if any(fnmatch.fnmatchcase(inner, glob) for glob in package_data.get(package, [])):
            return True
    return False


def test_every_data_file_the_library_reads_is_package_data():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in (ROOT / "pipeline").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "no data file found under pipeline/"
    missing = sorted(str(p.relative_to(ROOT)) for p in data if not packaged(p, package_data))
    assert not missing, f"files under pipeline/ a wheel would leave out (add them to [tool.setuptools.package-data]): {missing}"


def test_the_check_names_a_file_no_glob_matches():
    package_data = {"pipeline.scorers.bindclip": ["*.md"], "pipeline.encoders": ["configs/*.json"]}
    assert packaged(ROOT / "pipeline/scorers/bindclip/report.md", package_data)
    assert packaged(ROOT / "pipeline/encoders/configs/toy-vit.json", package_data)
    assert not packaged(ROOT / "pipeline/scorers/geometry/report.md", package_data)
