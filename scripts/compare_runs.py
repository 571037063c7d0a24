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
array's rows are compared, the ``done`` flags too (each array read whole, a few GB for the toy's); rows one store
holds and the other does not are counted. The projections (``params/*``) are compared as
they are, and every suite index through the keys (each item must name the same features;
a suite extracted from other manifest bytes counts as one difference).
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
        keys = {}  # modality -> (a's keys, b's keys), each [rows, key bytes]
        for modality in sorted(set(ga.group_keys()) & set(gb.group_keys()) & {"image", "text", "object"}):
            ka, kb = np.asarray(ga[f"{modality}/key"][:]), np.asarray(gb[f"{modality}/key"][:])
            keys[modality] = ka, kb
            row_b = {k.tobytes(): i for i, k in enumerate(kb)}
            pairs = np.array([(i, row_b[k.tobytes()]) for i, k in enumerate(ka) if k.tobytes() in row_b], dtype=np.int64).reshape(-1, 2)
            print(f"{sa.name} {modality}: {len(pairs)} rows in both, {len(ka) - len(pairs)} only in {a}, {len(kb) - len(pairs)} only in {b}")
            for name in sorted(ga[modality].array_keys()):
                if name == "key":
                    continue
                x, y = np.asarray(ga[f"{modality}/{name}"][:]), np.asarray(gb[f"{modality}/{name}"][:])  # whole arrays: slices are zarr's fast path
                bad = int((x[pairs[:, 0]] != y[pairs[:, 1]]).reshape(len(pairs), -1).any(1).sum())
                print(f"  {modality}/{name}: {bad} of {len(pairs)} shared rows differ")
                differ += bad
        for group in ("image", "text", "object"):
            if (group in ga) != (group in gb):
                print(f"  {group}: only in {a if group in ga else b}")
                differ += 1
        differ += _compare_params(ga, gb, a, b) + _compare_suites(ga, gb, keys, a, b)
    return differ


def _shared(ga, gb, group: str, listing: str, a: Path, b: Path) -> tuple[list[str], int]:
    """The members (``array_keys`` or ``group_keys``) of ``group`` both stores hold, sorted,
    and how many one store holds alone (each printed)."""
    in_a = set(getattr(ga[group], listing)()) if group in ga else set()
    in_b = set(getattr(gb[group], listing)()) if group in gb else set()
    for name in sorted(in_a ^ in_b):
        print(f"  {group}/{name}: only in {a if name in in_a else b}")
    return sorted(in_a & in_b), len(in_a ^ in_b)


def _compare_params(ga, gb, a: Path, b: Path) -> int:
    """The stored projections (``params/*``), array by array."""
    import numpy as np

    names, differ = _shared(ga, gb, "params", "array_keys", a, b)
    for name in names:
        same = np.array_equal(np.asarray(ga[f"params/{name}"][...]), np.asarray(gb[f"params/{name}"][...]))
        print(f"  params/{name}: {'same' if same else 'differs'}")
        differ += not same
    return differ


def _compare_suites(ga, gb, keys: dict, a: Path, b: Path) -> int:
    """Every suite index, through the keys: each item's cell must name the same features
    (or -1, no image) in both stores, whatever their row numbers."""
    import numpy as np

    names, differ = _shared(ga, gb, "suites", "group_keys", a, b)
    for suite in names:
        sa, sb = ga[f"suites/{suite}"], gb[f"suites/{suite}"]
        if sa.attrs.get("manifest_sha256") != sb.attrs.get("manifest_sha256"):
            print(f"  suites/{suite}: extracted from other manifests (other bytes); its index not compared")
            differ += 1
            continue
        kinds = sa.attrs.get("kinds", {})
        for column in sorted(set(sa.array_keys()) | set(sb.array_keys())):
            if column not in sa or column not in sb:
                print(f"  suites/{suite}/{column}: only in {a if column in sa else b}")
                differ += 1
                continue
            if kinds.get(column) not in keys or sb.attrs.get("kinds", {}).get(column) != kinds[column]:
                print(f"  suites/{suite}/{column}: its modality ({kinds.get(column)}) is not in both stores")
                differ += 1
                continue
            ka, kb = keys[kinds[column]]
            ra, rb = np.asarray(sa[column][:]), np.asarray(sb[column][:])
            if ra.shape != rb.shape:
                print(f"  suites/{suite}/{column}: shapes {ra.shape} and {rb.shape}")
                differ += 1
                continue
            width = ka.shape[1]
            xa = np.where((ra >= 0)[..., None], ka[np.maximum(ra, 0)], np.zeros(width, ka.dtype))
            xb = np.where((rb >= 0)[..., None], kb[np.maximum(rb, 0)], np.zeros(width, kb.dtype))
            bad = int(((xa != xb).any(-1) | ((ra < 0) != (rb < 0))).reshape(len(ra), -1).any(1).sum())
            print(f"  suites/{suite}/{column}: {bad} of {len(ra)} items differ")
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
