"""Compare what two `dvc repro` runs produced, file by file: are they the same bytes?

    .venv/bin/python scripts/compare_runs.py /path/to/fresh-clone /work/main
    .venv/bin/python scripts/compare_runs.py A B --store     # also the feature stores, row by row

Each side is a checkout whose pipeline has run. The files compared are the trained weights
(``cache/toyclip``, every ``model.safetensors`` under ``cache/checkpoints``), every metrics
file, the report and its figures and JSON payloads; a file present on one side only is
listed as such. Weights that differ are also compared tensor by tensor (largest absolute
difference), and metrics files key by key, so a difference can be sized. With ``--store``
the two feature stores are matched by their content keys (rows are numbered by each store's
history, so a fresh store and a grown one number the same features otherwise) and every
array's rows are compared (each array read whole, a few GB for the toy's); rows one store holds and the other does not are counted.
Exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

PATTERNS = (
    "cache/toyclip/model.safetensors",
    "cache/checkpoints/**/model.safetensors",
    "reports/metrics/**/*.json",
    "reports/report.md",
    "reports/*.json",
    "reports/figures/*.png",
    "reports/plots/metrics.csv",
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for pattern in PATTERNS for p in root.glob(pattern) if p.is_file()}


def weights_difference(a: Path, b: Path) -> str:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        return "other tensors"
    worst = max((float((x[k].double() - y[k].double()).abs().max()) for k in x), default=0.0)
    return f"max |Δ| {worst:.3g}"


def metrics_difference(a: Path, b: Path) -> str:
    x, y = (json.loads(p.read_text()).get("metrics", {}) for p in (a, b))
    moved = [f"{k} {x.get(k)} → {y.get(k)}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    return "; ".join(moved) or "metrics equal (other fields differ)"


def compare_files(a: Path, b: Path) -> int:
    left, right = files(a), files(b)
    differ = 0
    for name in sorted(left | right):
        if name not in right or name not in left:
            print(f"only in {a if name in left else b}: {name}")
            differ += 1
            continue
        if sha256(a / name) == sha256(b / name):
            continue
        differ += 1
        detail = ""
        if name.endswith(".safetensors"):
            detail = weights_difference(a / name, b / name)
        elif name.startswith("reports/metrics/"):
            detail = metrics_difference(a / name, b / name)
        print(f"differs: {name}" + (f" ({detail})" if detail else ""))
    print(f"{len(left | right) - differ} of {len(left | right)} files the same bytes")
    return differ


def compare_stores(a: Path, b: Path) -> int:
    import numpy as np
    import zarr

    differ = 0
    for sa in sorted((a / "cache/features").glob("*.zarr")):
        sb = b / "cache/features" / sa.name
        if not sb.is_dir():
            print(f"only in {a}: cache/features/{sa.name}")
            differ += 1
            continue
        ga, gb = zarr.open_group(str(sa), mode="r"), zarr.open_group(str(sb), mode="r")
        for modality in ("image", "text"):
            ka, kb = np.asarray(ga[f"{modality}/key"][:]), np.asarray(gb[f"{modality}/key"][:])
            row_b = {k.tobytes(): i for i, k in enumerate(kb)}
            pairs = np.array([(i, row_b[k.tobytes()]) for i, k in enumerate(ka) if k.tobytes() in row_b], dtype=np.int64)
            print(f"{sa.name} {modality}: {len(pairs)} rows in both, {len(ka) - len(pairs)} only in {a}, {len(kb) - len(pairs)} only in {b}")
            for name in sorted(ga[modality].array_keys()):
                if name in ("key", "done"):
                    continue
                x, y = np.asarray(ga[f"{modality}/{name}"][:]), np.asarray(gb[f"{modality}/{name}"][:])  # whole arrays: slices are zarr's fast path
                bad = int((x[pairs[:, 0]] != y[pairs[:, 1]]).reshape(len(pairs), -1).any(1).sum())
                print(f"  {modality}/{name}: {bad} of {len(pairs)} shared rows differ")
                differ += bad
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--store", action="store_true", help="also compare the feature stores row by row")
    args = parser.parse_args()
    differ = compare_files(args.a, args.b)
    if args.store:
        differ += compare_stores(args.a, args.b)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
