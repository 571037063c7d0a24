"""The files the report reads beside the scores, each read and checked in one place.

* measurements (:func:`read_measurement`, :func:`read_bench`): what ``pipeline bench ...``,
  ``pipeline probes`` and the measuring scripts leave in the report folder, ``{"command",
  "results"}`` JSON (``pipeline.perf.common.write_bench``);
* ``pipeline compare-encoders``' summary (:func:`read_summary`, ``report.encoders``).

An absent file is a note in its section; a present one that is not JSON, or not the shape
its writer gives it, is refused with one line naming the file, what is wrong and the command
that rewrites it, instead of failing inside a section or reading as absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.report import bench_command

COMPARE_COMMAND = "pipeline compare-encoders"  # writes the summary ``report.encoders`` names


def json_kind(x: Any) -> str:
    """A JSON value's kind as a phrase ("an array", "null"), for naming what a file holds."""
    kinds = (
        (dict, "an object"),
        (list, "an array"),
        (str, "a string"),
        (bool, "a boolean"),
        (int | float, "a number"),
    )
    return next((name for cls, name in kinds if isinstance(x, cls)), "null")


def read_json(path: Path, fix: str) -> Any:
    """The JSON in ``path``; a file that cannot be read or is not JSON is refused naming the
    file and ``fix`` (the command that rewrites it)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:  # a folder where the file belongs, no permission
        raise ValueError(
            f"{path} cannot be read ({e.strerror or e}); rerun `{fix}` to rewrite it"
        ) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(
            f"{path} is not JSON ({' '.join(str(e).split())}); rerun `{fix}` to rewrite it"
        ) from None


def measurement_command(path: Path) -> str:
    """The command that writes the measurement file ``path`` when the file cannot say:
    ``pipeline probes`` for ``probes.json``, else ``pipeline bench <name>`` into its folder."""
    path = Path(path)
    return (
        "pipeline probes" if path.name == "probes.json" else bench_command(path.parent, path.stem)
    )


def read_measurement(path: Path) -> tuple[str, dict[str, Any]]:
    """A measurement file's command and results: ``{"command", "results"}`` as
    ``write_bench`` writes it (a file without ``results`` is its own results, as
    ``scripts/bench_reads.py`` writes it); the command is "" where none is recorded.

    Raises:
        ValueError: the file cannot be read, is not JSON, or is not an object with an object
            of results; the message names the command that rewrites it (the file's own
            ``command`` where it records one, else :func:`measurement_command`).
    """
    data = read_json(path, measurement_command(path))
    recorded = data.get("command") if isinstance(data, dict) else None
    command = recorded if isinstance(recorded, str) else ""
    results = data.get("results", data) if isinstance(data, dict) else data
    if not isinstance(results, dict):
        what = (
            f"results that are {json_kind(results)}" if isinstance(data, dict) else json_kind(data)
        )
        raise ValueError(
            f'{path} holds {what}, not a measurement (an object {{"command", "results": {{...}}}}); rerun '
            f"`{command or measurement_command(path)}` to rewrite it"
        )
    return command, results


def read_bench(path: Path) -> dict[str, Any]:
    """The ``results`` of a ``pipeline bench`` file; {} when it is absent (its section says
    so). A file that is there but not a measurement is refused (:func:`read_measurement`)."""
    return read_measurement(path)[1] if Path(path).exists() else {}


def is_mean(m: Any) -> bool:
    """Whether ``m`` is one mean of a summary: ``value``, ``lo`` and ``hi`` numbers, where it
    has a difference to the baseline ``diff``, ``diff_lo`` and ``diff_hi`` numbers, and its
    ``tasks`` (when given) a list."""
    if not isinstance(m, dict):
        return False
    keys = ("value", "lo", "hi", *(("diff", "diff_lo", "diff_hi") if "diff" in m else ()))
    numbers = all(
        isinstance(m.get(k), int | float) and not isinstance(m.get(k), bool) for k in keys
    )
    return numbers and isinstance(m.get("tasks", []), list)


def summary_problem(summary: Any) -> str | None:
    """What in a ``pipeline compare-encoders`` summary is not the shape the report reads
    (``stages.compare``: ``encoders`` -> each its ``open_clip_model`` and ``variants`` ->
    each its ``means`` of ``{value, lo, hi}`` numbers and, against ``clip``, ``{diff, diff_lo,
    diff_hi}``; lists of ``variants`` and ``suites``, ``manifests`` and ``config`` objects);
    None when it is that shape."""
    if not isinstance(summary, dict):
        return f"it holds {json_kind(summary)}, not an object"
    encoders = summary.get("encoders")
    if not isinstance(encoders, dict) or not encoders:
        return "it has no `encoders` object"
    for key, kind in (("variants", list), ("suites", list), ("manifests", dict), ("config", dict)):
        value = summary.get(key, kind())
        if not isinstance(value, kind) or not all(
            isinstance(v, str) for v in value if kind is list
        ):
            return f"its `{key}` is not {'a list of names' if kind is list else 'an object'}"
    config = summary.get("config", {})
    if not all(isinstance(config.get(k, 0), int) for k in ("bootstrap", "seed")):
        return "its `config` has a bootstrap or seed that is not a whole number"
    for enc, e in encoders.items():
        model, variants = (
            e.get(k) if isinstance(e, dict) else None for k in ("open_clip_model", "variants")
        )
        if not (isinstance(model, str) and isinstance(variants, dict)):
            return f"its encoder {enc!r} lacks an `open_clip_model` name or a `variants` object"
        for variant, record in variants.items():
            means = record.get("means") if isinstance(record, dict) else None
            if not isinstance(means, dict) or not all(is_mean(m) for m in means.values()):
                return f"the means of {variant!r} on {enc!r} are not objects of value, lo and hi numbers"
    return None


def read_summary(path: Path) -> dict[str, Any] | None:
    """``pipeline compare-encoders``' summary at ``path``; None when it is absent.

    Raises:
        ValueError: it is there but cannot be read, is not JSON or is not the summary's
            shape (:func:`summary_problem`); the message names the file and the command.
    """
    if not Path(path).exists():
        return None
    summary = read_json(path, COMPARE_COMMAND)
    problem = summary_problem(summary)
    if problem is not None:
        raise ValueError(
            f"{path} is not a `{COMPARE_COMMAND}` summary ({problem}); rerun `{COMPARE_COMMAND}` to rewrite it, or "
            f"point report.encoders at its summary.json"
        )
    return summary
