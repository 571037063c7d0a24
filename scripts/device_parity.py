"""Extract and score on an accelerator against the CPU: the same store and the same scores.

    python scripts/device_parity.py --device cuda [--model ViT-B-32] [--images 128] [--out DIR]

A user with a GPU runs ``pipeline extract --device cuda`` and ``pipeline score --device
cuda``; this checks that path against the CPU one on the same inputs. Extract (the real
``pipeline.extraction.extract``: loader, writer thread, fingerprint, done flags) runs a
random-init open_clip model (``pretrained: none``, built on the CPU from ``init_seed`` and
moved, so both devices hold the same weights) over a suite of random images
(:func:`pipeline.perf.common.make_suite`), once on the CPU and once on ``--device``, each into
its own store. Then:

* every array of the two stores is compared: the largest absolute difference, and it over
  the array's largest magnitude (the stores keep grids in fp16, so two devices whose float32
  results differ in the last bits can round one value to neighbouring fp16 numbers);
  integer and boolean arrays (ids, masks, keys, done flags, suite indexes) must be equal;
* the two fingerprints must be equal: a store is the same store whichever device wrote it;
* each scorer of ``--variants`` (random init, every exact shortcut off: ``Scorer.full_path``)
  scores the suite from the CPU store on the CPU and from the device's store on the device
  (``pipeline.scoring.score_choice``, as the score stage runs it): the largest score
  difference, and how many items change which option wins.

Writes ``device-parity.json`` to ``--out`` (default ``reports/bench``) and prints a summary.
Nothing here is timed against a goal; the extract wall times are for orientation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def compare_stores(a: Path, b: Path) -> dict[str, dict[str, float]]:
    """Per array of store ``a`` (a zarr group path): max |a - b| and it over max |a|."""
    import numpy as np
    import zarr

    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    out = {}
    arrays = sorted((name, arr) for name, arr in ga.members(max_depth=None) if isinstance(arr, zarr.Array))
    for name, arr in arrays:
        x = arr[...]
        y = gb[name][...]
        if x.shape != y.shape:
            raise ValueError(f"{name}: shape {x.shape} on the CPU, {y.shape} on the device")
        if x.dtype.kind in "biu":
            out[name] = {"max_abs": float(np.abs(x.astype(np.int64) - y.astype(np.int64)).max(initial=0)), "exact": True}
            continue
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        scale = float(np.abs(x.astype(np.float64)).max(initial=0.0))
        out[name] = {"max_abs": float(d.max(initial=0.0)), "max_rel": float(d.max(initial=0.0)) / scale if scale else 0.0}
    return out


def table(result: dict[str, Any]) -> str:
    """The comparison as Markdown: each float array's largest difference relative to its
    largest magnitude, whether the exact arrays are equal, each scorer's largest score
    difference and winner changes."""
    exact = [n for n, r in result["arrays"].items() if r.get("exact")]
    lines = [f"{result['model']} ({result['weights']}), {result['images']} images and {result['captions']} captions: "
             f"CPU against {result['device_name']} ({result['device']}, torch {result['torch']}); same fingerprint: "
             f"{'yes' if result['same_fingerprint'] else 'NO'}; integer and boolean arrays ({', '.join(exact)}) "
             f"{'equal' if result['exact_arrays_equal'] else 'DIFFER'}; extract took {result['extract_wall_s']['cpu']} s "
             f"on the CPU, {result['extract_wall_s']['device']} s on the device.", "",
             "| store array | max abs difference | over the array's max abs |", "|---|---:|---:|"]  # fmt: skip
    lines += [f"| `{n}` | {r['max_abs']:.3g} | {r['max_rel']:.2g} |" for n, r in result["arrays"].items() if not r.get("exact")]
    lines += ["", "| scorer | max abs score difference | items whose winning option changes |", "|---|---:|---:|"]
    lines += [f"| {v} | {r['max_abs']:.3g} | {r['winner_changes']} of {r['items']} |" for v, r in result["scores"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="the device checked against the CPU (default cuda)")
    ap.add_argument("--model", default="ViT-B-32", help="encoder key, random init (default ViT-B-32)")
    ap.add_argument("--images", type=int, default=128, help="random images, two captions each (default 128)")
    ap.add_argument("--batch-size", type=int, default=32, help="extract batch size (default 32)")
    ap.add_argument("--variants", nargs="+", default=["clip", "local-max", "bindclip", "global-m", "flowclip"], help="scorers compared")
    ap.add_argument("--out", type=Path, default=REPO / "reports" / "bench")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from pipeline.cache import FeatureStore
    from pipeline.cache.open import store_path
    from pipeline.extraction import extract
    from pipeline.perf.common import extract_cfg, make_suite, write_bench
    from pipeline.scorers import create_scorer
    from pipeline.scoring import score_choice

    suite = "shapes-sugarcrepe"  # make_suite's suite is extracted under this name
    devices = {"cpu": "cpu", "device": args.device}
    result: dict[str, Any] = {"model": args.model, "weights": "random init (pretrained: none)", "images": args.images,
                              "captions": 2 * args.images, "batch_size": args.batch_size, "device": args.device,
                              "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device,
                              "torch": torch.__version__}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = make_suite(folder, args.images, 256)
        stores, walls = {}, {}
        for key, device in devices.items():
            cfg = extract_cfg(folder, manifest, args.model, args.batch_size)
            cfg.pretrained, cfg.device, cfg.out = "none", device, str(folder / f"features-{key}")
            t0 = time.perf_counter()
            extract(cfg, progress=False)
            walls[key] = round(time.perf_counter() - t0, 2)
            stores[key] = store_path(cfg)
        result["extract_wall_s"] = walls
        opened = {k: FeatureStore.open(p) for k, p in stores.items()}
        result["same_fingerprint"] = opened["cpu"].fingerprint == opened["device"].fingerprint
        result["arrays"] = compare_stores(stores["cpu"], stores["device"])
        index = opened["cpu"].suite_index(suite)
        if not np.array_equal(index["captions"], opened["device"].suite_index(suite)["captions"]):
            raise AssertionError("the two stores index the suite's captions differently")
        scores = {}
        for v in args.variants:
            out = {}
            for key, device in devices.items():
                torch.manual_seed(0)
                store = opened[key]
                scorer = create_scorer(v, dims=store.dims, proj=store.projections()).eval().full_path().to(device)
                out[key] = score_choice(scorer, store, index, args.batch_size)
            diff = np.abs(out["cpu"] - out["device"])
            flips = int((np.nanargmax(out["cpu"], 1) != np.nanargmax(out["device"], 1)).sum())
            scores[v] = {"max_abs": float(np.nanmax(diff)), "winner_changes": flips, "items": len(out["cpu"])}
        result["scores"] = scores
    bad = [n for n, r in result["arrays"].items() if r.get("exact") and r["max_abs"] != 0]
    result["exact_arrays_equal"] = not bad
    result["table_markdown"] = table(result)
    command = (f"scripts/device_parity.py --device {args.device} --model {args.model} --images {args.images} "
               f"--batch-size {args.batch_size} --variants {' '.join(args.variants)}")  # fmt: skip
    out = write_bench("device-parity", command, result, args.out)
    print(result["table_markdown"])
    print(f"-> {out}", file=sys.stderr)
    if bad or not result["same_fingerprint"]:
        raise SystemExit(f"parity failed: exact arrays differ {bad}, same fingerprint {result['same_fingerprint']}")
    return result


if __name__ == "__main__":
    main()
