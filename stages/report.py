"""Stage `report`: assemble ``reports/report.md`` from the registered sections.

Reads the score stage's outputs (``cache/scores``), the manifests and images, and the
measurements that ``pipeline bench ...`` and ``pipeline probes`` leave in the report folder;
where a scores table leaves items out, the feature store's suite index (only the items whose
image was not extracted may be left out); sections that need the trained scorers open the
store and checkpoints (``cache/features``, ``cache/checkpoints``) on demand. Every section
(:mod:`pipeline.report`: the generic ones, and one per scorer family that has a ``report``
module) runs in order; this stage only loads, assembles and writes: ``reports/report.md``, the
figures they drew (``reports/figures/*.png``), their JSON payloads (``reports/diagnostics.json``)
and tables (``reports/plots/metrics.csv``, a long table for ``dvc plots``).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import extracted_items
from pipeline.cache import CacheError, open_store, store_path
from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
from pipeline.files import write_atomically, write_json_atomically, write_text_atomically
from pipeline.manifests import file_sha256, manifest_coverage, read_manifest, resolve_source
from pipeline.report import FIGURE_DPI, ReportContext, render
from pipeline.scorers import SCORERS
from pipeline.scorers.checkpoints import seed_checkpoints
from pipeline.scoring import scores_array, scores_origin


def check_head_to_head(cfg: ReportConfig) -> None:
    """Refuse a ``report.head_to_head`` name no scorer has: the section shows only the names
    that were scored, so a typo would drop its column, or the whole table, without a word. A
    suffixed run (``bindclip@seed0``) is checked by its variant's name."""
    SCORERS.check_known([v.split("@", 1)[0] for v in cfg.head_to_head], "report.head_to_head")


def few(ids: list[str], n: int = 5) -> str:
    """Up to ``n`` item ids, comma-separated, "…" after them when there are more."""
    return ", ".join(ids[:n]) + (", …" if len(ids) > n else "")


def extracted_of(
    suite: str, manifest: pd.DataFrame, sha: str, extract: ExtractConfig, tables: dict[Path, list[str]]
) -> np.ndarray | None:
    """[n] bool over ``manifest``: the items every scores table of ``suite`` (``tables``: path
    -> its item ids) must hold, in the manifest's order; None when every table holds every item
    (nothing left out, and the store is not opened). Otherwise the items whose every image was
    extracted, read from the store's suite index (:func:`pipeline.benchmarks.base.extracted_items`,
    the items :func:`pipeline.scoring.drop_missing` keeps for the score stage): only those may
    be missing from a table, so a table with rows deleted, added or reordered after scoring is
    refused instead of being read as items skipped at extract.

    Raises:
        ValueError: a table holds other items than those, or the store cannot say which they are.
    """
    ids = manifest["item_id"].astype(str).tolist()
    if all(t == ids for t in tables.values()):
        return None
    first = next(p for p, t in tables.items() if t != ids)
    try:
        store = open_store(extract)
        keep = extracted_items(store.suite_index(suite, manifest_sha256=sha))  # [n]
    except CacheError as e:
        raise ValueError(
            f"{first} leaves out items of {suite}, and the feature store that says which images were missing at "
            f"extract cannot be read: {e}"
        ) from None
    expected = [i for i, k in zip(ids, keep, strict=True) if k]
    for path, t in tables.items():
        if t == expected:
            continue
        lacks, extra = sorted(set(expected) - set(t)), sorted(set(t) - set(expected))
        wrong = [f"lacks {len(lacks)} ({few(lacks)})"] if lacks else []
        wrong += [f"holds {len(extra)} others ({few(extra)})"] if extra else []
        wrong += ["repeats items"] if len(t) != len(set(t)) else []
        how = " and ".join(wrong) or "lists them in another order than the manifest"
        raise ValueError(
            f"{path} does not score exactly the {len(expected)} items of {suite} whose images were extracted into "
            f"{store.path}: it {how}; rerun `pipeline score`"
        )
    return keep


def load_results(score: ScoreConfig, extract: ExtractConfig) -> dict[str, Any]:
    """{suite: {"manifest": df, "manifest_sha256": hex, "image_root": path, "scores": {variant:
    [n, K]}, "missing": [ids], "categories": {"present", "missing"} or None, "text_metrics":
    {name: value}}} for what the score stage wrote (the configured variants, each
    seed variant's ``@seed<k>``, each replaced variant's ``@<mode>``). ``categories`` is the
    manifest's record of the categories present and missing of a suite with one file per
    category (:func:`pipeline.manifests.manifest_coverage`); ``text_metrics`` the text-only
    metrics of the suite's metrics file (:func:`text_metrics`). Items the score stage
    left out because their image was missing at extract are taken out of the manifest too and
    listed under ``missing``, so every table's denominator is the scored items and the report
    can name what is left out. ``manifest_sha256`` is the manifest file's hash, by which the
    report knows whether a result computed elsewhere (``pipeline compare-encoders``) is of
    these suites. A table may leave out only those items (:func:`extracted_of`, which reads the
    store's suite index when some table lacks items).

    Every scores table must record that it was scored with ``score.encoder``, all from one
    feature store, and on the manifest file the configuration names (its sha256;
    :func:`pipeline.scoring.scores_origin`): a table left by a run on another encoder, an
    earlier store or a rebuilt or edited manifest would otherwise be reported as this run's,
    its scores joined to other items.

    Raises:
        ValueError: nothing at all was scored (the report would be its header alone), or
            the scores tables come from another encoder, from more than one store or from
            another manifest, or hold other items than the manifest's extracted ones.
    """
    out: dict[str, Any] = {}
    stores: dict[str, Path] = {}  # store fingerprint_id -> the first table scored from it
    for suite in score.suites:
        src = resolve_source(suite, extract.world, extract.manifests, extract.image_roots)  # the manifests score read
        manifest = read_manifest(src.manifest)
        entry = {"manifest": manifest, "manifest_sha256": file_sha256(src.manifest), "image_root": src.image_root,
                 "scores": {}, "missing": [],
                 "categories": manifest_coverage(src.manifest, SUITES.get(suite), manifest)}  # fmt: skip
        names = list(score.variants)
        for variant in score.seed_variants:  # the seeds the score stage scores: the last training's
            names += [f"{variant}@{d.name}" for d in seed_checkpoints(variant, score.checkpoints)]
        for variant in score.replaced:
            names += [f"{variant}@{mode}" for mode in score.replacements]
        tables: dict[Path, list[str]] = {}  # each table's item ids
        for name in names:
            path = Path(score.scores_out) / name / f"{suite}.parquet"
            if not path.is_file():
                continue
            try:
                origin = scores_origin(path) or {}
                table = pd.read_parquet(path)  # once, for its ids and its scores
                ids, scores = table["item_id"].astype(str).tolist(), scores_array(table)
            except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
                raise ValueError(f"{path} is damaged ({' '.join(str(e).split())}); rerun `pipeline score`") from None
            if origin.get("encoder") != score.encoder:
                was = f"with encoder {origin['encoder']!r}" if origin else "by an older pipeline (no origin recorded)"
                raise ValueError(
                    f"{path} was scored {was}, not score.encoder {score.encoder!r}; rerun `pipeline score`"
                )
            if origin.get("manifest_sha256") != entry["manifest_sha256"]:
                raise ValueError(
                    f"{path} was scored on another manifest of {suite} than {src.manifest} (other bytes, or none "
                    f"recorded); rerun `pipeline score`"
                )
            stores.setdefault(origin.get("store"), path)
            if len(stores) > 1:  # the first table of the first store, and this one
                raise ValueError(f"{next(iter(stores.values()))} and {path} were scored from different feature "
                                 f"stores of {score.encoder}; rerun `pipeline score`")  # fmt: skip
            tables[path] = ids
            entry["scores"][name] = scores
        entry["text_metrics"] = text_metrics(score, suite, list(entry["scores"]))
        keep = extracted_of(suite, manifest, entry["manifest_sha256"], extract, tables)
        if keep is not None:  # items whose image was missing (or undecodable) at extract
            entry["missing"] = manifest.loc[~keep, "item_id"].astype(str).tolist()
            entry["manifest"] = manifest[keep].reset_index(drop=True)
        out[suite] = entry
    if not any(entry["scores"] for entry in out.values()):
        raise ValueError(
            f"no scores under {score.scores_out} for score.variants ({', '.join(score.variants)}) on "
            f"score.suites ({', '.join(score.suites)}): run `pipeline score` first"
        )
    check_current_store(stores, score, extract)
    return out


def text_metrics(score: ScoreConfig, suite: str, variants: list[str]) -> dict[str, float]:
    """A suite's text-only metrics (SugarCrepe++'s TOT: ``Suite.text_units``) as the first of
    ``variants`` with a metrics file records them (``<metrics_out>/<variant>/<suite>.json``):
    the frozen text encoder's, the same in every variant's file, over every item of the
    manifest; {} for a suite without them or where no metrics file is there.

    Raises:
        ValueError: the metrics file is not JSON or holds no ``metrics`` object, naming it.
    """
    spec = SUITES.get(suite)
    if spec.text_units is None:
        return {}
    for variant in variants:
        path = Path(score.metrics_out) / variant / f"{suite}.json"
        if not path.is_file():
            continue
        try:
            metrics = json.loads(path.read_text())["metrics"]
            return {k: float(v) for k, v in metrics.items() if k not in spec.metric_names}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} is damaged ({type(e).__name__}: {e}); rerun `pipeline score`") from None
    return {}


def check_current_store(stores: dict[str, Path], score: ScoreConfig, extract: ExtractConfig) -> None:
    """Refuse scores tables of one store (``stores``: its ``fingerprint_id`` -> a table) when
    the configured store is another one: an extract that replaced the store (another
    checkpoint, another configuration) leaves the old scores behind, and the report would
    present the old model's numbers as this run's. Without a readable store there is nothing
    to compare with; the sections that read the store say so."""
    if len(stores) != 1 or None in stores:  # nothing scored, or no store recorded
        return
    ((scored_from, first),) = stores.items()
    try:
        current = open_store(extract).root.attrs.get("fingerprint_id")
    except CacheError:
        return
    if current is not None and current != scored_from:
        raise ValueError(
            f"{first} was scored from an earlier feature store of {score.encoder} (fingerprint {scored_from}), "
            f"not the one at {store_path(extract)} now ({current}); rerun `pipeline score`"
        )


def write_outputs(ctx: ReportContext) -> None:
    """Save what the sections left in the context: figures, JSON payloads, CSV tables (into
    the report folder, made when absent)."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    if ctx.figures:
        import matplotlib.pyplot as plt

        (ctx.out / "figures").mkdir(parents=True, exist_ok=True)
        for name, fig in ctx.figures.items():
            # the temporary file's name ends in .tmp, so the image format is named
            save = partial(fig.savefig, dpi=FIGURE_DPI, format=Path(name).suffix[1:])
            write_atomically(ctx.out / "figures" / name, save)
            plt.close(fig)
    for name, payload in ctx.json_files.items():
        write_json_atomically(ctx.out / name, payload, indent=1)
    for name, table in ctx.tables.items():
        (ctx.out / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(ctx.out / name, lambda p, table=table: table.to_csv(p, index=False))


def run(cfg: ReportConfig, score: ScoreConfig, extract: ExtractConfig) -> Path:
    check_head_to_head(cfg)
    out = Path(cfg.out)
    ctx = ReportContext(load_results(score, extract), cfg, score, extract, out)
    text = render(ctx)
    write_outputs(ctx)
    path = out / "report.md"
    write_text_atomically(path, text)
    return path
