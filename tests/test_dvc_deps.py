"""Every stage in dvc.yaml (and real/dvc.yaml) lists the project code it runs in its ``deps``.

DVC reruns a stage only when one of its deps changes, so a module that a stage imports
but does not list makes ``dvc repro`` silently reuse stale outputs after an edit. For each
stage (``foreach``/``matrix`` stages expanded, e.g. ``train@bindclip``) this test takes
its entry module (``cmd: pipeline <word> ...`` -> ``stages/<word>.py``), follows every
``import`` / ``from ... import`` in it and in the project modules it reaches (module level
and inside functions: the code imports lazily), including the parent packages'
``__init__.py`` files, the submodules that a ``Registry(kind, "some.package")`` (or a
subclass named ``...Registry``) imports on its first lookup and the modules an
``import_module(f"{PACKAGE}.{name}.report")`` can reach, and checks that a dep equals each file or is a folder above it.
The console script's module (``pipeline/cli.py``) runs too: it is followed through what the
stage's command reaches (its module level, the command's function and the helpers it calls).

Nothing here names today's modules: files may move between packages and the checker
follows them. Data deps (``cache/features``) and package data (JSON configs) are not
checked. Pure stdlib + PyYAML; no module of the project is imported.
"""

from __future__ import annotations

import ast
import fnmatch
import pkgutil
import posixpath
import re
import shlex
import tomllib
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DVC_YAML = ROOT / "dvc.yaml"
PARAMS_YAML = ROOT / "params.yaml"
PIPELINES = (("", DVC_YAML), ("real", ROOT / "real" / "dvc.yaml"))  # (folder, its dvc.yaml)
PROJECT_PACKAGES = ("pipeline", "stages")  # top-level packages whose modules are checked
COMMAND = "pipeline"  # the console script every stage's cmd runs
STAGE_PACKAGE = "stages"  # `pipeline <word>` runs stages/<word>.py
# files whose import_module argument the checker cannot read, and what covers those imports
DYNAMIC_IMPORTS = {
    "pipeline/registry.py": "a registry loads its own package: the Registry(kind, package) calls name it, and are followed",
    "pipeline/perf/scoring.py": "a registered scorer's family package: the scorer registry's Registry call names them",
}


# --------------------------------------------------------------------------- dvc.yaml


_INTERP = re.compile(r"(?<!\\)\$\{(?P<inner>[^}]*)\}")


def _select(context: dict[str, Any], expr: str) -> Any:
    """``${a.b[0]}`` looked up in ``context`` (DVC's dotted/indexed selection)."""
    cur: Any = context
    for part in expr.strip().replace("[", ".").replace("]", "").split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif (
            isinstance(cur, list)
            and part.lstrip("-").isdigit()
            and -len(cur) <= int(part) < len(cur)
        ):
            cur = cur[int(part)]
        else:
            raise KeyError(f"${{{expr}}}: {part!r} not found (params.yaml, vars, item/key)")
    return cur


def _to_str(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _interpolate(value: Any, context: dict[str, Any]) -> Any:
    """DVC templating: a whole-string ``${x}`` keeps x's type; otherwise substituted as text."""
    if isinstance(value, str):
        whole = _INTERP.fullmatch(value)
        if whole:
            return _select(context, whole["inner"])
        text = _INTERP.sub(lambda m: _to_str(_select(context, m["inner"])), value)
        return text.replace("\\${", "${")
    if isinstance(value, list):
        return [_interpolate(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v, context) for k, v in value.items()}
    return value


def _load_context(dvc: dict[str, Any], root: Path, params: Path | None) -> dict[str, Any]:
    """What ``${...}`` can name: params.yaml (DVC's default) then the top-level ``vars``."""
    context: dict[str, Any] = {}
    if params is not None and params.exists():
        context.update(yaml.safe_load(params.read_text()) or {})
    for var in dvc.get("vars") or []:
        if isinstance(var, dict):
            context.update(var)
            continue
        path, _, keys = str(var).partition(":")
        if not path.endswith((".yaml", ".yml", ".json")) or not (root / path).exists():
            continue
        data = yaml.safe_load((root / path).read_text()) or {}
        context.update({k: data[k] for k in keys.split(",") if k in data} if keys else data)
    return context


_FIELDS = ("cmd", "deps", "wdir")  # all this test reads of a stage


def expand_stages(dvc: dict[str, Any], context: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stage name -> its resolved ``cmd``/``deps``/``wdir``, with DVC's generated names.

    ``foreach`` over a list of scalars names ``stage@<value>``; over a list holding dicts or
    lists, ``stage@<index>``; over a dict, ``stage@<key>`` (``${key}`` and ``${item}``).
    ``matrix`` names ``stage@<v1>-<v2>`` (``k<index>`` for a composite value), ``${item.k}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, spec in (dvc.get("stages") or {}).items():
        spec = spec or {}
        if "foreach" in spec or "matrix" in spec:
            if "matrix" in spec:
                matrix = _interpolate(spec["matrix"], context)
                if not isinstance(matrix, dict):
                    raise TypeError(
                        f"stage {name!r}: matrix must be a dict, got {type(matrix).__name__}"
                    )
                axes = {k: list(_interpolate(v, context)) for k, v in matrix.items()}
                iterations = []
                for combo in product(*(list(enumerate(v)) for v in axes.values())):
                    frags = [
                        f"{k}{i}" if isinstance(v, dict | list) else _to_str(v)
                        for k, (i, v) in zip(axes, combo, strict=True)
                    ]
                    key = "-".join(frags)
                    iterations.append(
                        (
                            key,
                            {
                                "key": key,
                                "item": dict(zip(axes, (v for _, v in combo), strict=True)),
                            },
                        )
                    )
                template = {k: v for k, v in spec.items() if k != "matrix"}
            else:
                it = _interpolate(spec["foreach"], context)
                if isinstance(it, dict):
                    iterations = [
                        (_to_str(k), {"key": _to_str(k), "item": v}) for k, v in it.items()
                    ]
                elif isinstance(it, list):
                    composite = any(isinstance(v, dict | list) for v in it)
                    iterations = [
                        (_to_str(i if composite else v), {"item": v}) for i, v in enumerate(it)
                    ]
                else:
                    raise TypeError(
                        f"stage {name!r}: foreach must resolve to a list or dict, got {type(it).__name__} ({it!r})"
                    )
                template = spec.get("do") or {}
            for key, extra in iterations:
                ctx = {**context, **extra}
                out[f"{name}@{key}"] = {
                    f: _interpolate(template[f], ctx) for f in _FIELDS if f in template
                }
        else:
            out[name] = {f: _interpolate(spec[f], context) for f in _FIELDS if f in spec}
    return out


def stage_deps(stage: dict[str, Any]) -> list[str]:
    """The stage's deps as repo-relative POSIX paths (``wdir`` applied, ``./`` and ``/`` trimmed)."""
    wdir = str(stage.get("wdir") or ".")
    deps = []
    for dep in stage.get("deps") or []:
        for path in dep if isinstance(dep, dict) else [dep]:
            deps.append(posixpath.normpath(posixpath.join(wdir, str(path))))
    return deps


def covered(path: str, deps: list[str]) -> bool:
    """A dep covers ``path`` when it is that file or a folder above it."""
    return any(d in (".", path) or path.startswith(d.rstrip("/") + "/") for d in deps)


# --------------------------------------------------------------------------- imports


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def locate(root: Path, name: str) -> Path | None:
    """The file of dotted module ``name`` under ``root`` (a package's ``__init__.py``)."""
    base = root.joinpath(*name.split("."))
    for cand in (base / "__init__.py", base.with_name(base.name + ".py")):
        if cand.is_file():
            return cand
    return None


def _exists(root: Path, name: str) -> bool:
    """``name`` is a module, a package or a namespace package (a folder without __init__)."""
    return locate(root, name) is not None or root.joinpath(*name.split(".")).is_dir()


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _registry_package(node: ast.Call) -> str | None:
    """``Registry(kind, "pkg")`` / ``Registry(kind, package="pkg")``: the literal package
    (a subclass named ``...Registry``, e.g. ``SectionRegistry``, counts too)."""
    if not (_call_name(node) or "").endswith("Registry"):
        return None
    pkg = _literal(node.args[1]) if len(node.args) > 1 else None
    for kw in node.keywords:
        if kw.arg == "package":
            pkg = _literal(kw.value)
    return pkg


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` assignments (what an f-string import can name)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value)
            if value is not None:
                out[node.targets[0].id] = value
    return out


def _formatted_names(tree: ast.Module, constants: dict[str, str]) -> dict[str, set[str]]:
    """Every ``name = f"..."`` assignment in the module (any scope): name -> its patterns."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.JoinedStr):
                out.setdefault(node.targets[0].id, set()).update(_module_patterns(node.value, constants, {}))
    return out


def _module_patterns(node: ast.AST, constants: dict[str, str], formatted: dict[str, set[str]]) -> set[str]:
    """The dotted-name patterns an ``import_module`` argument can take: a literal itself; a
    module-level string constant's value; an f-string (or a name assigned one in the module)
    with its module-level constants filled in and every other field a ``*``."""
    if _literal(node) is not None:
        return {_literal(node)}
    if isinstance(node, ast.Name):
        return {constants[node.id]} if node.id in constants else formatted.get(node.id, set())
    if not isinstance(node, ast.JoinedStr):
        return set()
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.value.id in constants:
            parts.append(constants[value.value.id])
        else:
            parts.append("*")
    return {"".join(parts)}


def matching_modules(root: Path, pattern: str) -> set[str]:
    """The project modules (and packages) whose dotted names match ``pattern``, segment by
    segment (``fnmatch``: ``pipeline.scorers.*.report``)."""
    names = {""}
    for segment in pattern.split("."):
        nxt = set()
        for name in names:
            folder = root.joinpath(*name.split(".")) if name else root
            if not folder.is_dir():
                continue
            children = {p.stem if p.suffix == ".py" else p.name for p in folder.iterdir() if p.suffix == ".py" or p.is_dir()}
            nxt.update(f"{name}.{c}" if name else c for c in children if fnmatch.fnmatchcase(c, segment) and c != "__init__")
        names = nxt
    return {n for n in names if _exists(root, n)}


@cache
def direct_imports(root: Path, path: Path, packages: tuple[str, ...], command: str | None = None) -> frozenset[str]:
    """Dotted project modules ``path`` imports anywhere in its body (relative ones resolved).

    ``from a import b`` imports ``a`` and, where ``b`` is a submodule, ``a.b``; a
    ``Registry(kind, "pkg")`` imports ``pkg`` and each of its public submodules (as
    ``pkgutil.iter_modules`` lists them); ``importlib.import_module("literal")`` counts too,
    and ``import_module(f"{PKG}.{name}.report")`` every existing module its pattern matches
    (module-level string constants filled in, any other field a wildcard; a pattern whose
    top-level package is itself a field, as in the registry's own loader, is left to the
    ``Registry(...)`` calls).

    With ``command`` (the CLI module and the word a stage runs), only what running that
    command reaches: the module level, the command's function and the module's functions
    it calls, not the other commands' bodies.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = _module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    constants = _constants(tree)
    formatted = _formatted_names(tree, constants)
    found: set[str] = set()
    nodes = ast.walk(tree) if command is None else _command_nodes(tree, command, path)
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                keep = len(parts) - (node.level - 1)
                if keep <= 0:
                    raise ImportError(
                        f"{path}: relative import beyond the top-level package (line {node.lineno})"
                    )
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(
                f"{base}.{a.name}"
                for a in node.names
                if a.name != "*" and _exists(root, f"{base}.{a.name}")
            )
        elif isinstance(node, ast.Call):
            pkg = _registry_package(node)
            if pkg:
                found.add(pkg)
                pkg_dir = root.joinpath(*pkg.split("."))
                found.update(
                    f"{pkg}.{m.name}"
                    for m in pkgutil.iter_modules([str(pkg_dir)])
                    if not m.name.startswith("_")
                )
            elif _call_name(node) in ("import_module", "__import__") and node.args:
                patterns = _module_patterns(node.args[0], constants, formatted)
                if not patterns and path.relative_to(root).as_posix() not in DYNAMIC_IMPORTS:
                    # resolves to no file: the stage test names it rather than dropping it
                    found.add(f"{packages[0]}.<an import_module argument the checker cannot read, {path.name} line {node.lineno}>")
                for mod in patterns:
                    if mod and not mod.startswith(".") and "*" not in mod.split(".")[0]:
                        found.update(matching_modules(root, mod) if "*" in mod else {mod})
    return frozenset(n for n in found if n.split(".")[0] in packages)


def _command_nodes(tree: ast.Module, word: str, path: Path) -> list[ast.AST]:
    """The nodes ``<cli> <word>`` runs: module-level statements (function and class bodies
    left out), the function registered as ``word`` (``@app.command("word")`` or
    ``@app.command()`` on ``def word``), the app's callbacks (``@app.callback()``: typer runs
    them before every command) and, transitively, the module's functions they name."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    def registered(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
        for d in fn.decorator_list:
            if isinstance(d, ast.Call) and _call_name(d) == "command":
                given = d.args[0].value if d.args and isinstance(d.args[0], ast.Constant) else None
                return given or fn.name.replace("_", "-")
        return None

    command = next((fn for fn in functions.values() if registered(fn) == word), None)
    if command is None:
        pytest.fail(f"{path}: no function registered as the command {word!r}")
    callbacks = [fn for fn in functions.values() if any(isinstance(d, ast.Call) and _call_name(d) == "callback" for d in fn.decorator_list)]
    reached, todo = {command.name, *(fn.name for fn in callbacks)}, [command, *callbacks]
    while todo:
        fn = todo.pop()
        # a name the function binds itself (a parameter, a local variable) is not the module's
        # function of that name: `score = load_config(...)` inside `report` calls no `score`
        local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in functions and node.id not in local | reached:
                reached.add(node.id)
                todo.append(functions[node.id])
    nodes: list[ast.AST] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if stmt.name in reached:
                nodes.extend(ast.walk(stmt))
            elif isinstance(stmt, ast.ClassDef):  # the class statement itself, not its methods
                nodes.extend(n for b in stmt.bases for n in ast.walk(b))
        else:
            nodes.extend(ast.walk(stmt))
    return nodes


def imported_files(
    root: Path, entries: list[Path], packages: tuple[str, ...], exempt: frozenset[str] = frozenset(),
    commands: dict[str, str] | None = None,
) -> tuple[set[str], set[str]]:
    """Files (repo-relative POSIX) that importing ``entries`` loads, transitively, and the
    project module names that resolve to nothing. ``exempt`` files are neither listed nor
    followed; a file of ``commands`` (file -> command word) is followed only through what
    that command reaches (:func:`direct_imports`).
    """
    files: set[str] = set()
    unresolved: set[str] = set()
    todo: list[Path] = []

    def add(name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a.b.c loads a/__init__.py, a/b/__init__.py, then c
            prefix = ".".join(parts[:i])
            file = locate(root, prefix)
            if file is None:
                if not root.joinpath(*parts[:i]).is_dir():
                    unresolved.add(name)
                    return
                continue  # namespace package: no file
            rel = file.relative_to(root).as_posix()
            if rel not in files and rel not in exempt:
                files.add(rel)
                todo.append(file)

    for entry in entries:
        add(_module_name(root, entry))
    while todo:
        file = todo.pop()
        for name in sorted(direct_imports(root, file, packages, (commands or {}).get(file.relative_to(root).as_posix()))):
            add(name)
    return files, unresolved


# --------------------------------------------------------------------------- the stages


def _cli_file() -> str:
    """The console script's own module, from pyproject.toml: a stage's cmd runs it, so a
    stage lists it and what its command reaches (:func:`_command_nodes`)."""
    try:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        return scripts[COMMAND].partition(":")[0].replace(".", "/") + ".py"
    except (FileNotFoundError, KeyError):
        return f"{COMMAND}/cli.py"


def command_words(cmd: Any) -> list[str]:
    """The ``<word>`` of each ``pipeline <word> ...`` of a stage's ``cmd``."""
    return [next(a for a in shlex.split(str(one))[1:] if not a.startswith("-")) for one in (cmd if isinstance(cmd, list) else [cmd])]


def entry_modules(stage: str, cmd: Any) -> list[Path]:
    """``pipeline <word> ...`` -> stages/<word>.py (one per command of a list ``cmd``)."""
    entries = []
    for one in cmd if isinstance(cmd, list) else [cmd]:
        argv = shlex.split(str(one or ""))
        words = [a for a in argv[1:] if not a.startswith("-")]
        if not argv or argv[0] != COMMAND or not words or {"&&", "||", ";", "|"} & set(argv):
            pytest.fail(
                f"stage {stage!r}: cmd {one!r} is not `{COMMAND} <word> ...` (one command per cmd entry); "
                f"this test maps `{COMMAND} <word>` to {STAGE_PACKAGE}/<word>.py and cannot tell what else runs"
            )
        rel = f"{STAGE_PACKAGE}/{words[0].replace('-', '_')}.py"
        if not (ROOT / rel).is_file():
            pytest.fail(
                f"stage {stage!r}: cmd {one!r} runs `{COMMAND} {words[0]}`, but {rel} does not exist"
            )
        entries.append(ROOT / rel)
    return entries


def _stages() -> dict[str, dict[str, Any] | Exception]:
    """Every stage of every pipeline: ``dvc.yaml`` (its stages by name) and each sub-project's
    (``real/dvc.yaml``, named ``real/<stage>``, its deps read relative to its folder)."""
    out: dict[str, dict[str, Any] | Exception] = {}
    for folder, dvc_yaml in PIPELINES:
        label = f"{folder}/" if folder else ""
        try:
            dvc = yaml.safe_load(dvc_yaml.read_text()) or {}
            stages = expand_stages(dvc, _load_context(dvc, dvc_yaml.parent, dvc_yaml.parent / PARAMS_YAML.name))
        except Exception as e:  # reported by the test, not as a collection error
            out[f"<{label}dvc.yaml>"] = e
            continue
        if not stages:
            out[f"<{label}no stages>"] = ValueError("no stages")
        for name, spec in stages.items():
            if folder:
                spec = {**spec, "wdir": posixpath.join(folder, str(spec.get("wdir") or "."))}
            out[f"{label}{name}"] = spec
    return out


STAGES = _stages()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_imported_modules(stage: str) -> None:
    spec = STAGES[stage]
    if isinstance(spec, Exception):
        pytest.fail(f"could not expand {DVC_YAML.name}: {type(spec).__name__}: {spec}")
    entries = entry_modules(stage, spec.get("cmd"))
    files: set[str] = set()
    unresolved: set[str] = set()
    for word in command_words(spec.get("cmd")):  # the CLI module, through its one command
        found, lost = imported_files(ROOT, [*entries, ROOT / _cli_file()], PROJECT_PACKAGES, commands={_cli_file(): word})
        files |= found
        unresolved |= lost
    deps = stage_deps(spec)
    missing = sorted(f for f in files if not covered(f, deps))
    problems = []
    if missing:
        problems.append(
            f"stage {stage!r} imports project modules that its deps do not cover "
            f"(add them to the stage's deps in dvc.yaml):\n"
            + "\n".join(f"  - {m}" for m in missing)
        )
    if unresolved:
        problems.append(
            f"stage {stage!r} imports project modules that resolve to no file (moved or removed?):\n"
            + "\n".join(f"  - {m}" for m in sorted(unresolved))
        )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_the_library_never_imports_the_stages() -> None:
    """Dependencies run one way, ``pipeline.cli`` -> ``stages`` -> the library: no module of
    ``pipeline/`` but the CLI's (the console script's module and the ``bench`` commands it
    loads) imports ``stages``, at module level or lazily."""
    cli = {_cli_file(), "pipeline/perf/cli.py"}
    offenders = sorted(
        f.relative_to(ROOT).as_posix()
        for f in (ROOT / "pipeline").rglob("*.py")
        if f.relative_to(ROOT).as_posix() not in cli
        and any(m.split(".")[0] == STAGE_PACKAGE for m in direct_imports(ROOT, f, PROJECT_PACKAGES))
    )
    assert offenders == [], f"library modules importing {STAGE_PACKAGE}: {offenders}"


# --------------------------------------------------------------------------- the checker itself


def test_a_cli_command_reaches_its_own_body_its_helpers_and_the_module_level(tmp_path: Path) -> None:
    files = {
        "app/__init__.py": "",
        "app/cli.py": (
            "from app import top\n"
            "class Lazy(Base):\n    def get(self):\n        from app import bench\n"  # a method: not run by a stage
            "def _helper():\n    from app import helped\n"
            "@app.command('run-it')\ndef run_it():\n    from app import mine\n    _helper()\n"
            "@app.command()\ndef other():\n    from app import theirs\n"
            "@app.command()\ndef shadow():\n    other = 1\n    return other\n"  # a local, not the command
            "@app.callback()\ndef main():\n    from app import every\n"  # runs before every command
        ),
        **{f"app/{m}.py": "" for m in ("top", "bench", "helped", "mine", "theirs", "every")},
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    cli = tmp_path / "app/cli.py"
    found, _ = imported_files(tmp_path, [cli], ("app",), commands={"app/cli.py": "run-it"})
    assert found == {"app/__init__.py", "app/cli.py", "app/top.py", "app/mine.py", "app/helped.py", "app/every.py"}
    assert "app/theirs.py" in imported_files(tmp_path, [cli], ("app",), commands={"app/cli.py": "other"})[0]
    assert "app/theirs.py" not in imported_files(tmp_path, [cli], ("app",), commands={"app/cli.py": "shadow"})[0]


def test_import_resolver_on_a_temporary_package(tmp_path: Path) -> None:
    files = {
        "app/__init__.py": "from .core import helper\n",  # relative import in a package __init__
        "app/core.py": "import json\n\ndef helper():\n    from app.sub import lazy\n    return lazy\n",
        "app/sub/__init__.py": "",
        "app/sub/lazy.py": "from .. import plugins_home\nfrom app.sub import deep\n",  # from-import of a submodule
        "app/sub/deep.py": "import numpy\n",
        "app/plugins_home.py": "from app.registry import Registry\nR = Registry('plugin', 'app.plugins')\n",
        "app/registry.py": "",
        "app/plugins/__init__.py": "",
        "app/plugins/one.py": "",
        "app/plugins/_private.py": "",
        "app/unused.py": "",
        "entry/run.py": "def main():\n    from app import core  # lazy\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    found, unresolved = imported_files(tmp_path, [tmp_path / "entry/run.py"], ("app", "entry"))
    assert found == {
        "entry/run.py",
        "app/__init__.py",
        "app/core.py",
        "app/sub/__init__.py",
        "app/sub/lazy.py",
        "app/sub/deep.py",
        "app/plugins_home.py",
        "app/registry.py",
        "app/plugins/__init__.py",
        "app/plugins/one.py",
    }
    assert unresolved == set()
    assert imported_files(tmp_path, [tmp_path / "app/sub/deep.py"], ("app",))[0] == {
        "app/__init__.py",
        "app/core.py",
        "app/sub/__init__.py",
        "app/sub/deep.py",
        "app/sub/lazy.py",
        "app/plugins_home.py",
        "app/registry.py",
        "app/plugins/__init__.py",
        "app/plugins/one.py",
    }  # importing app.sub.deep runs app/__init__.py first, which reaches the rest
    (tmp_path / "app/unused.py").write_text("import app.gone\n")
    assert imported_files(tmp_path, [tmp_path / "app/unused.py"], ("app",))[1] == {"app.gone"}

    assert covered("pipeline/ot/sinkhorn.py", ["cache/features", "pipeline/ot"])
    assert covered("pipeline/ot/sinkhorn.py", ["pipeline/ot/"]) and covered("x.py", ["."])
    assert not covered("pipeline/otx.py", ["pipeline/ot"])


def test_registry_subclasses_and_pattern_imports(tmp_path: Path) -> None:
    files = {
        "app/__init__.py": "",
        "app/registry.py": "class Registry: ...\n",
        "app/sections.py": (
            "import importlib\nfrom app.registry import Registry\nFAMILIES = 'app.fam'\n"
            "class SectionRegistry(Registry):\n"
            "    def _load(self, fam):\n        name = f'{FAMILIES}.{fam}.report'\n        importlib.import_module(name)\n"
            "S = SectionRegistry('section', 'app.generic')\n"
        ),
        "app/generic/__init__.py": "",
        "app/generic/table.py": "",
        "app/fam/__init__.py": "",
        "app/fam/one/__init__.py": "",
        "app/fam/one/report.py": "from app.fam.one import helper\n",
        "app/fam/one/helper.py": "",
        "app/fam/two/__init__.py": "",  # no report module: nothing to reach
        "app/fam/two/scorer.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    found, unresolved = imported_files(tmp_path, [tmp_path / "app/sections.py"], ("app",))
    assert found == {
        "app/__init__.py",
        "app/registry.py",
        "app/sections.py",
        "app/generic/__init__.py",
        "app/generic/table.py",
        "app/fam/__init__.py",
        "app/fam/one/__init__.py",
        "app/fam/one/report.py",
        "app/fam/one/helper.py",
    }
    assert unresolved == set()
    assert matching_modules(tmp_path, "app.fam.*.report") == {"app.fam.one.report"}
    assert matching_modules(tmp_path, "app.*") == {"app.registry", "app.sections", "app.generic", "app.fam"}
    # a module constant is read; an argument the checker cannot read is reported, not dropped
    (tmp_path / "app/named.py").write_text("import importlib\nPKG = 'app.generic'\nimportlib.import_module(PKG)\n")
    assert "app/generic/__init__.py" in imported_files(tmp_path, [tmp_path / "app/named.py"], ("app",))[0]
    (tmp_path / "app/joined.py").write_text("import importlib\nimportlib.import_module('.'.join(['app', 'generic']))\n")
    _, unresolved = imported_files(tmp_path, [tmp_path / "app/joined.py"], ("app",))
    assert unresolved == {"app.<an import_module argument the checker cannot read, joined.py line 2>"}


def test_foreach_and_matrix_expansion() -> None:
    dvc = {
        "stages": {
            "plain": {"cmd": "pipeline a", "deps": ["stages/a.py"]},
            "train": {
                "foreach": "${train.variants}",
                "do": {"cmd": "pipeline train --variant ${item}", "deps": ["x/${item}.py"]},
            },
            "d": {
                "foreach": {"k1": {"f": "one"}},
                "do": {"cmd": "pipeline d ${key}", "deps": ["${item.f}"]},
            },
            "l": {"foreach": [{"f": "one"}], "do": {"cmd": "pipeline l", "deps": ["${item.f}"]}},
            "m": {
                "matrix": {"v": ["p", "q"], "s": [0]},
                "cmd": "pipeline m ${item.v} ${item.s}",
                "deps": ["${key}"],
                "wdir": "sub",
            },
        }
    }
    out = expand_stages(dvc, {"train": {"variants": ["bindclip", "clip"]}})
    assert sorted(out) == ["d@k1", "l@0", "m@p-0", "m@q-0", "plain", "train@bindclip", "train@clip"]
    assert out["train@clip"] == {"cmd": "pipeline train --variant clip", "deps": ["x/clip.py"]}
    assert out["d@k1"]["cmd"] == "pipeline d k1" and out["d@k1"]["deps"] == ["one"]
    assert out["m@q-0"]["cmd"] == "pipeline m q 0" and stage_deps(out["m@q-0"]) == ["sub/q-0"]
