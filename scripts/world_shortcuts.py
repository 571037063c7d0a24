"""Shortcut baselines on the built shapes world (:mod:`pipeline.world.shortcuts`), with
shapes-train's negation family, which the report does not score.

    .venv/bin/python scripts/world_shortcuts.py [--world cache/world]

Reads the manifests and images ``pipeline world`` wrote; writes nothing; prints JSON (a rate
over no decided item is null).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.manifests import read_manifest  # noqa: E402
from pipeline.world.shortcuts import depth_phrase, negation_count, subject_half, whatsup_shortcuts  # noqa: E402


def _json(x):
    """``x`` as strict JSON: numbers as floats, a rate nothing decided (NaN) as null."""
    if isinstance(x, dict):
        return {k: _json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json(v) for v in x]
    if isinstance(x, str | bool) or x is None:
        return x
    if isinstance(x, int):
        return x
    return None if math.isnan(float(x)) else float(x)


def _rows(df, column: str, values: list[str]):
    return df[df[column].isin(values)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=Path, default=Path("cache/world"))
    args = parser.parse_args()
    manifest = lambda suite: read_manifest(args.world / "manifests" / f"{suite}.parquet")  # noqa: E731
    out = {
        "shapes-whatsup": whatsup_shortcuts(manifest("shapes-whatsup"), args.world / "images"),
        "shapes-sugarcrepe replace-rel": depth_phrase(manifest("shapes-sugarcrepe")),
        "shapes-sugarcrepe replace-rel subject's half": subject_half(_rows(manifest("shapes-sugarcrepe"), "category", ["replace-rel"])),
        **{f"{s} negation": negation_count(manifest(s)) for s in ("shapes-train", "shapes-dev")},
        **{f"{s} relative-geometry and vertical subject's half": subject_half(_rows(manifest(s), "family", ["relative-geometry", "vertical"]))
           for s in ("shapes-train", "shapes-dev")},
    }
    print(json.dumps(_json(out), indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
