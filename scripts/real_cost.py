"""What the full real-data run costs on this machine's CPU and on a GPU, from measured per-item figures.

    .venv/bin/python scripts/real_cost.py   # measures (~2 min idle), writes reports/bench/real-cost.json
    .venv/bin/python scripts/real_cost.py --reuse reports/bench/real-cost.json  # re-estimate only
    python scripts/real_cost.py --device cuda --reuse reports/bench/real-cost.json  # the GPU column

The run is ``cd real && dvc repro`` (``real/dvc.yaml`` with ``real/params.yaml``): ``extract``
encodes every image and caption of the real suites once with ViT-L-14-336; ``train`` fits
bindclip, global-m, flowclip and flowclip-cimr, three seeds each, on ``coco-families[train]``
with dev selection on ``coco-families[validation]``; ``ridge`` fits ridge-fgw's map on
``coco-objects-train``; ``score`` scores every variant on every suite, again per training seed
and with shuffled and fixed images; ``report`` renders. The estimate is per-item figures times
item counts.

Per-item figures:

* measured here, ViT-L-14-336 at random init (speed does not depend on the weights;
  :func:`pipeline.perf.common.random_encoder` builds the config ``pretrained: openai`` runs,
  ``ViT-L-14-336-quickgelu``), at ``--threads`` torch threads:

  - seconds per image: extract's loader (decode, 336 px preprocessing) and
    ``Encoder.encode_images``, the forward that returns the layer-5 and final grids extract
    stores, on random images (:func:`pipeline.perf.common.make_suite`) after a one-image
    warm-up;
  - seconds per caption: the tokenizer and ``Encoder.encode_texts``, after a warm-up batch;
  - per trainable variant, seconds per optimisation step at its ``real/params.yaml`` batch
    size (the family's ``FamilyTrainer.loss``, backward, AdamW; ``--train-steps`` steps after
    a warm-up step), and its dev
    evaluation (``dev_metrics``) and post-training choice (``select``) per dev item. The
    family's own ``load`` reads a coco-families-format suite (grounding columns, paraphrases
    on the geometric families, a train/validation split) held in memory, whose features are
    the ones the encoder just produced, tiled so that every item has its own image row;
  - ``score_matrix`` pairs per second of each per-caption scorer (the retrieval suite scores
    every query against the whole gallery), and in-memory choice pairs per second
    (``option_scores``) of every choice scorer;

* read: ``reports/bench/scoring.json`` (``pipeline bench scoring``, its ViT-L-14-336 entry),
  choice pairs per second of each scorer from the cache, store reads included: the choice
  suites are estimated with these, and with the in-memory rate only for a variant the file
  lacks; ``reports/bench/rerank.json`` (``pipeline bench rerank``), ms per query of each
  geometry reranker.

Counts, per suite, each with its source: a built manifest (``extract.manifests``) or the
official files under ``manifests.roots`` where this machine has them, read by the suite's own
builder; otherwise the official files in ``../shared/benchmarks`` for the categories there and
the sizes documented in ``../shared/design/benchmarks.md`` and in the builders for the rest.
Documented caption counts are upper bounds, since extract keys captions by their text and
encodes a repeated one once. Images are keyed by content too: suites reading one image folder
(``extract.image_roots``) share rows, so a folder counts once, up to its size where known, and
a suite made of another's rows (``coco-families-dev``) adds none.

``--device cuda`` measures the same figures with the encoder, the scorers and the training
data on the GPU (every timer read after a synchronisation) and keeps the CPU figures of the
``--reuse`` file: the table then has a GPU column, whose choice and retrieval scoring use the
GPU's in-memory rates (``scoring.json`` is a CPU bench) and whose rerankers keep their CPU
cost (their solvers run on the host).

What is not measured (the manifests, ridge and report stages, reading the training features,
the GPU figures until a ``--device cuda`` run) is listed as such and left out of the total.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "ViT-L-14-336"
PARAMS = REPO / "real" / "params.yaml"
SHARED = REPO.parent / "shared" / "benchmarks"  # official files kept beside the repo
BENCH = REPO / "reports" / "bench"
NO_GPU = "not measured (no GPU lent)"
NOT_MEASURED = "not measured"
UNCOUNTED = "not counted"
HOUR = 3600.0

COCO_2017 = {"val2017": 5000, "train2017": 118287}  # images per COCO 2017 split folder
COCO_SOURCE = "COCO 2017 split sizes (cocodataset.org: train2017 118,287 images, val2017 5,000)"
COCO_CATEGORIES = 80  # instance categories of instances_*2017.json

# ---------------------------------------------------------------------------- counts


@dataclass
class SuiteCount:
    """What one suite gives extract and score to do."""

    suite: str
    task: str  # "choice" or "retrieval"
    items: int  # test items (retrieval: queries)
    options: int  # caption options per item (retrieval: 1, the query)
    images: int  # distinct images of its rows (a crop counts apart); retrieval: the gallery
    captions: int  # captions extract encodes for it
    pool: str  # the folder its images are read from; suites reading one folder share rows
    source: str  # where the figures come from
    exact: bool = False  # counted from the suite's files (else documented or bounded)
    dev_items: int | None = None  # rows of a training dev selection (coco-families[validation])
    keys: frozenset | None = field(default=None, repr=False)  # (path, crop) per image, if counted
    texts: frozenset | None = field(default=None, repr=False)  # its distinct captions, if counted
    within: str | None = None  # a suite whose rows hold all of its images and captions


@dataclass(frozen=True)
class Documented:
    """A suite's documented size, for when its files are not on this machine."""

    items: int
    options: int
    images: int
    image_dir: str  # folder of its images under the suite's image root
    source: str
    crops: bool = False  # rows keyed by (image, box): a folder shared with no other suite


DOCUMENTED = {
    "aro-relation": Documented(23937, 2, 23937, "", "benchmarks.md §1.1: 23,937 items; one crop_box per item, so at most one image row each", crops=True),
    "aro-attribution": Documented(28748, 2, 28748, "", "benchmarks.md §1.1: 28,748 items; one crop_box per item, so at most one image row each", crops=True),
    "aro-coco-order": Documented(25010, 5, 5000, "val2014", "benchmarks.md §1.1, §1.3: 25,010 items over the 5,000 Karpathy-test images, 5 options each"),
    "aro-flickr-order": Documented(5000, 5, 1000, "flickr30k-images", "benchmarks.md §1.1, §1.3: 1,000 test images, one item per caption (5,000 expected, not counted there), 5 options each"),
    "whatsup-a": Documented(412, 4, 412, "data/controlled_images", "benchmarks.md §3.1: 412 items, one image each (103 object pairs x 4 arrangements), 4 options"),
    "whatsup-b": Documented(408, 4, 408, "data/controlled_clevr", "benchmarks.md §3.1: 408 items, one image each (102 x 4), 4 options"),
    "whatsup-coco": Documented(2687, 2, 2687, "val2017", "benchmarks.md §3.1: 2,247 + 440 items, 2 options; at most one image per item (What'sUp's own val2017 copy)"),
    "whatsup-vg": Documented(1451, 2, 1451, "vg_images", "benchmarks.md §3.1: 1,160 + 291 items, 2 options; at most one image per item"),
}  # fmt: skip
# items per category: SugarCrepe (benchmarks.md §2.1); SugarCrepe++ has its five non-add ones (§4.1)
SUGARCREPE_ITEMS = {"add-obj": 2062, "add-att": 692, "replace-obj": 1652, "replace-att": 788, "replace-rel": 1406, "swap-obj": 245, "swap-att": 666}  # fmt: skip
SUGARCREPE_PP_ITEMS = {k: v for k, v in SUGARCREPE_ITEMS.items() if not k.startswith("add")}
SUGARCREPE_IMAGES = 1560  # COCO val2017 images of the 7 SugarCrepe categories (benchmarks.md §2.1)


def family_template_texts(categories: int = COCO_CATEGORIES) -> int:
    """Distinct texts the template families of coco-families can produce over ``categories``
    names (``pipeline/benchmarks/coco_families.py``): negation "a photo of A and no Bs" over
    ordered pairs; relative-geometry, depth and vertical "A <relation> B" with two relations
    each over ordered pairs (their paraphrases have the same form); absolute-position, two
    sides per name, and as many paraphrases."""
    pairs = categories * (categories - 1)
    return pairs + 3 * 2 * pairs + 2 * 2 * categories


def split_share(value: str) -> float:
    """Share of the hash buckets ``bucket_split`` gives to ``value``: the expected share of a
    hash-split suite's rows in that split."""
    from pipeline.benchmarks.base import bucket_split

    return sum(bucket_split(b) == value for b in range(10)) / 10


def count_manifest(
    suite: str, manifest, image_root: Path, source: str, dev: str | None
) -> SuiteCount:
    """Counts of a built manifest: distinct (image path, crop) over the suite's image columns
    and distinct texts over its caption columns, as extract keys them (by path here; extract's
    content keys can only merge more); ``dev``: the split value of a dev selection."""
    from pipeline.benchmarks import SUITES
    from pipeline.manifests import cells

    spec = SUITES.get(suite)
    crops = manifest["crop_box"].tolist() if "crop_box" in manifest else [None] * len(manifest)
    keys = set()
    for col in (c for c in spec.image_columns if c in manifest):
        for paths, crop in zip(cells(manifest[col]), crops, strict=True):
            box = None if crop is None else tuple(float(v) for v in crop)
            keys.update((os.path.normpath(str(image_root / p)), box) for p in paths if p)
    columns = [c for c in spec.caption_columns if c in manifest]
    texts = {t for c in columns for cs in cells(manifest[c]) for t in cs if t}
    options = 1 if spec.task == "retrieval" else max(len(c) for c in manifest["captions"])
    dev_items = (
        int((manifest["split"].astype(str) == dev).sum()) if dev and "split" in manifest else None
    )
    folders = {os.path.dirname(k[0]) for k in keys}
    pool = folders.pop() if len(folders) == 1 else os.path.normpath(str(image_root))
    return SuiteCount(suite, spec.task, len(manifest), options, len(keys), len(texts), pool, source,
                      exact=True, dev_items=dev_items, keys=frozenset(keys), texts=frozenset(texts))  # fmt: skip


def _read_categories(module, folder: Path, categories) -> dict:
    """``{category: rows}`` of the official category files present in ``folder``."""
    from pipeline.benchmarks.sugarcrepe import file_name

    paths = {c: folder / file_name(c) for c in categories}
    return {c: module.read_category(p, c) for c, p in paths.items() if p.is_file()}


def phrases_per_caption() -> tuple[float | None, int]:
    """Mean number of ``split_phrases`` object phrases per COCO caption over the SugarCrepe
    positives in ``../shared/benchmarks`` (COCO val2017 captions), and how many were read."""
    from pipeline.benchmarks import sugarcrepe
    from pipeline.benchmarks.phrases import split_phrases

    found = _read_categories(sugarcrepe, SHARED / "sugarcrepe", sugarcrepe.CATEGORIES)
    captions = [c[0] for df in found.values() for c in df["captions"]]
    if not captions:
        return None, 0
    return sum(len(split_phrases(c)[0]) for c in captions) / len(captions), len(captions)


def sugarcrepe_count(suite: str, pool: str) -> SuiteCount:
    """SugarCrepe or SugarCrepe++: the category files in ``../shared/benchmarks`` read by the
    builder's reader, the documented sizes for the categories not there."""
    from pipeline.benchmarks import sugarcrepe, sugarcrepe_pp

    if suite == "sugarcrepe":
        module, documented, k, folder = sugarcrepe, SUGARCREPE_ITEMS, 2, SHARED / "sugarcrepe"
        what = f"benchmarks.md §2.1: 7,511 items over {SUGARCREPE_IMAGES:,} COCO val2017 images, 2 options"
    else:
        module, documented, k, folder = (
            sugarcrepe_pp,
            SUGARCREPE_PP_ITEMS,
            3,
            SHARED / "sugarcrepe_pp",
        )
        what = (f"benchmarks.md §4.1-4.2: 4,757 items, 3 options (P1, P2, N), the images of SugarCrepe's "
                f"same categories (at most {SUGARCREPE_IMAGES:,})")  # fmt: skip
    found = _read_categories(module, folder, documented)
    texts = {t for df in found.values() for cs in df["captions"] for t in cs}
    images = {p for df in found.values() for p in df["image"]}
    counted = {c: len(df) for c, df in found.items()}
    absent = {c: n for c, n in documented.items() if c not in found}
    differ = {c: (n, documented[c]) for c, n in counted.items() if n != documented[c]}
    source = (
        f"{what}; counted here with the builder's reader on {', '.join(sorted(counted)) or 'no file'} "
        f"in {folder}: {sum(counted.values()):,} items, {len(images):,} images, {len(texts):,} distinct captions"
        + (f" (item counts differing from the documented ones: {differ})" if differ else "")
        + (f"; {', '.join(sorted(absent))} documented only: {sum(absent.values()):,} items x {k} "
           f"captions, an upper bound" if absent else "")
    )  # fmt: skip
    captions = len(texts) + k * sum(absent.values())
    return SuiteCount(
        suite, "choice", sum(documented.values()), k, SUGARCREPE_IMAGES, captions, pool, source
    )


def documented_count(
    suite: str, image_root: Path, phrases: tuple[float | None, int], dev: str | None, image_share: float = 1.0
) -> SuiteCount:
    """A suite's counts without its files: documented sizes and the builders' structure;
    ``phrases``: :func:`phrases_per_caption`; ``dev``: the split value of a dev selection;
    ``image_share``: the suite's ``manifests.image_share`` (coco-families keeps that share
    of its images)."""

    def pool(folder: str) -> str:
        return os.path.normpath(str(image_root / folder))

    if suite in DOCUMENTED:
        d = DOCUMENTED[suite]
        where = pool(d.image_dir) + (f" [{suite} crops]" if d.crops else "")
        return SuiteCount(suite, "choice", d.items, d.options, d.images, d.items * d.options, where,
                          f"{d.source}; captions at most items x options")  # fmt: skip
    if suite in ("sugarcrepe", "sugarcrepe-pp"):
        return sugarcrepe_count(suite, pool(""))
    if suite == "coco-families":
        images = round(COCO_2017["train2017"] * image_share)
        items = 8 * images
        share = split_share(dev) if dev else None
        source = (
            f"upper bounds from its builder (pipeline/benchmarks/coco_families.py) on {COCO_SOURCE}: "
            + ("every train2017 image" if image_share == 1 else f"the {image_share:.0%} of train2017 images manifests.image_share keeps")
            + ", at most one item per family (8 families), at most 2 texts per image "
            f"for each caption-derived family (entity, attribute, role-swap), at most "
            f"{family_template_texts():,} distinct texts of the template families over {COCO_CATEGORIES} categories"
            + (f"; dev rows {share:.0%} of the items (the split rule's hash buckets)" if share else "")
        )  # fmt: skip
        captions = 6 * images + family_template_texts()
        dev_items = None if share is None else round(items * share)
        return SuiteCount(
            suite,
            "choice",
            items,
            2,
            images,
            captions,
            pool("train2017"),
            source,
            dev_items=dev_items,
        )
    if suite == "coco-families-dev":
        parent = documented_count("coco-families", image_root, phrases, "validation", image_share)
        share = split_share("validation")
        images = round(parent.images * share)
        source = (
            f"coco-families' validation rows (its builder): {share:.0%} of the items and, the split hashing "
            f"image paths, of the images of the coco-families bounds; its images and captions are "
            f"coco-families rows, so extract encodes none of them again"
        )  # fmt: skip
        captions = 6 * images + family_template_texts()
        return SuiteCount(suite, "choice", parent.dev_items, 2, images, captions, parent.pool, source,
                          within="coco-families")  # fmt: skip
    if suite in ("coco-objects", "coco-objects-train"):
        split, items, which = (
            ("val2017", COCO_2017["val2017"], "every captioned val2017 image")
            if suite == "coco-objects"
            else ("train2017", 10000, "the first 10,000 captioned train2017 images (its builder)")
        )
        mean, n = phrases
        extra = 0 if mean is None else round(items * mean)
        how = ("phrases not counted (no COCO caption here)" if mean is None else
               f"{mean:.2f} split_phrases phrases per caption (measured on {n:,} SugarCrepe positives, "
               f"COCO val2017 captions), not deduplicated")  # fmt: skip
        source = (f"{COCO_SOURCE}; {which}, one query each; captions = queries + at most "
                  f"{COCO_CATEGORIES} object names + {how}")  # fmt: skip
        return SuiteCount(
            suite,
            "retrieval",
            items,
            1,
            items,
            items + COCO_CATEGORIES + extra,
            pool(split),
            source,
        )
    source = f"{UNCOUNTED}: no documented size here; build its manifest (`pipeline manifests`) to count it"
    return SuiteCount(suite, "choice", 0, 0, 0, 0, pool(""), source)


def count_suites(params: Path) -> list[SuiteCount]:
    """Counts of every suite ``extract`` encodes under ``params``: from its built manifest or
    its official files where present (the suite's own builder), else documented."""
    from pipeline.benchmarks import SUITES
    from pipeline.benchmarks.base import SuiteSelection, image_share_mask
    from pipeline.config import (
        ExtractConfig,
        ManifestsConfig,
        load_config,
        load_train_config,
        train_variants,
    )
    from pipeline.manifests import read_manifest

    base = params.parent
    ext = load_config(ExtractConfig, params, "extract")
    manifests = load_config(ManifestsConfig, params, "manifests")
    roots, shares = manifests.roots, manifests.image_share
    dev = {}  # suite -> the split value of a training dev selection
    for v in train_variants(params):
        sel = SuiteSelection.parse(load_train_config(params, v).dev_suite)
        if sel.column == "split":
            dev[sel.suite] = sel.value
    phrases = phrases_per_caption()
    out = []
    for suite in ext.suites:
        image_root = base / ext.image_roots.get(suite, "")
        built = base / ext.manifests[suite] if suite in ext.manifests else None
        if built is not None and built.is_file():
            out.append(
                count_manifest(
                    suite,
                    read_manifest(built),
                    image_root,
                    f"counted: built manifest {built}",
                    dev.get(suite),
                )
            )
            continue
        root = base / roots[suite] if suite in roots else None
        if root is not None and root.is_dir():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    manifest = SUITES.get(suite).build_manifest(root)
                if suite in shares:  # as the manifests stage cuts it
                    manifest = manifest[image_share_mask(manifest, shares[suite])].reset_index(drop=True)
                out.append(
                    count_manifest(
                        suite,
                        manifest,
                        image_root,
                        f"counted: its builder on {root}",
                        dev.get(suite),
                    )
                )
                continue
            except FileNotFoundError:
                pass  # the folder lacks the suite's files: documented below
        out.append(documented_count(suite, image_root, phrases, dev.get(suite), shares.get(suite, 1.0)))
    return out


# ---------------------------------------------------------------------------- the estimate (pure)


@dataclass
class Figures:
    """Per-item costs, seconds on this machine."""

    s_per_image: float
    s_per_caption: float
    train: dict[str, dict[str, float]]  # variant -> s_per_step, dev_s_per_item, select_s_per_item
    choice_pairs_per_s: dict[str, float]  # image-caption pairs of choice items per second
    retrieval_pairs_per_s: dict[str, float]  # query-image pairs of score_matrix per second
    rerank_s_per_query: dict[str, float]  # a reranker's cost per query on top of its base's


@dataclass(frozen=True)
class TrainPlan:
    """One trainable variant's ``train`` stage."""

    seeds: int
    steps: int
    batch_size: int
    eval_every: int
    dev_items: int  # rows of its dev selection, cut to train.dev_items
    train_items: int  # rows of its training selection, cut to train.train_items


@dataclass(frozen=True)
class ScorerKind:
    """How the score stage treats a variant (its scorer's class attributes)."""

    pairwise: bool = False  # compares two captions: skipped on retrieval suites
    reranker: bool = False  # reranks the shortlists of ``base`` on retrieval suites
    scores_choices: bool = True  # False: skipped on choice suites
    base: str | None = None  # a reranker's shortlisting scorer


@dataclass
class ScorePlan:
    """The ``score`` stage: which variant scores which suite how often."""

    variants: list[str]
    suites: list[str]
    kinds: dict[str, ScorerKind]
    references: dict[str, int | None]  # suite -> its pairwise_reference option
    replaced: list[str] = field(default_factory=list)  # variants scored again per replacement
    replacements: int = 0  # image-replacement modes (choice suites, main runs only)
    seed_runs: dict[str, int] = field(default_factory=dict)  # variant -> its other seeds' runs
    seed_suites: list[str] = field(default_factory=list)  # suites the seed runs score


def encoded_rows(
    counts: list[SuiteCount], pool_sizes: dict[str, int] = COCO_2017
) -> tuple[int, int]:
    """Image and caption rows extract writes, each encoded once across suites.

    Suites counted from their files are united by image key and by caption text. Of the
    others, a suite ``within`` another one of ``counts`` adds nothing; an image folder gives
    the sum of its suites' images, capped at the folder's size where ``pool_sizes`` (folder
    name -> images) knows it; captions are summed.
    """
    names = {c.suite for c in counts}
    rest = [c for c in counts if c.within not in names]
    pools: dict[str, list[SuiteCount]] = {}
    for c in rest:
        pools.setdefault(c.pool, []).append(c)
    keys: set = set()
    images = 0
    for pool, group in pools.items():
        if all(c.keys is not None for c in group):
            keys.update(*(c.keys for c in group))
        else:
            cap = pool_sizes.get(os.path.basename(pool), math.inf)
            images += min(sum(c.images for c in group), cap)
    texts = set().union(*(c.texts for c in rest if c.texts is not None))
    captions = len(texts) + sum(c.captions for c in rest if c.texts is None)
    return int(len(keys) + images), int(captions)


def n_dev_evals(steps: int, eval_every: int) -> int:
    """Dev evaluations of one seed in the training loop: step 0, every ``eval_every`` steps and
    the last step, then one on the selected checkpoint."""
    return 1 + steps // eval_every + (steps % eval_every != 0) + 1


def training_seconds(plan: TrainPlan, figures: dict[str, float]) -> dict[str, float]:
    """One variant's training, every seed: steps, dev evaluations, its post-training choice."""
    evals = n_dev_evals(plan.steps, plan.eval_every)
    steps = plan.seeds * plan.steps * figures["s_per_step"]
    dev = plan.seeds * evals * plan.dev_items * figures["dev_s_per_item"]
    select = plan.seeds * plan.dev_items * figures["select_s_per_item"]
    return {"steps_s": steps, "dev_s": dev, "select_s": select, "total_s": steps + dev + select,
            "dev_evals_per_seed": evals}  # fmt: skip


def suite_score_seconds(
    variant: str, kind: ScorerKind, count: SuiteCount, reference: int | None, figures: Figures
) -> float | None:
    """Seconds of one scoring of ``count``'s suite by ``variant``; None where the score stage
    skips it (a pairwise scorer on retrieval, a retrieval-only reranker on choices).

    Retrieval scores every query against the gallery (for a reranker its base does, then each
    query's shortlist is reranked). On choice items a per-caption scorer scores each option;
    a pairwise scorer makes K(K-1)/2 ``score_pair`` calls per item (K-1 against a reference
    option), each costing two pairs of ``choice_pairs_per_s``, which is measured on 2-option
    items that take one call each.
    """
    if count.task == "retrieval":
        if kind.pairwise:
            return None
        pairs = count.items * count.images  # queries x gallery
        if kind.reranker:
            base = pairs / figures.retrieval_pairs_per_s[kind.base]
            return base + count.items * figures.rerank_s_per_query[variant]
        return pairs / figures.retrieval_pairs_per_s[variant]
    if not kind.scores_choices:
        return None
    k = count.options
    if kind.pairwise:
        calls = k - 1 if reference is not None else k * (k - 1) // 2
        return count.items * calls * 2 / figures.choice_pairs_per_s[variant]
    return count.items * k / figures.choice_pairs_per_s[variant]


def scoring_seconds(
    plan: ScorePlan, counts: list[SuiteCount], figures: Figures
) -> dict[str, dict[str, float]]:
    """Seconds of the score stage per variant: its main run on every suite, its image
    replacements on the choice suites and its other seeds' runs."""
    by_suite = {c.suite: c for c in counts}
    out: dict[str, dict[str, float]] = {}
    for v in dict.fromkeys([*plan.variants, *plan.seed_runs]):
        row = {"main_s": 0.0, "replacements_s": 0.0, "seeds_s": 0.0}
        for s in plan.suites:
            count = by_suite[s]
            sec = suite_score_seconds(v, plan.kinds[v], count, plan.references.get(s), figures)
            if sec is None:
                continue
            if v in plan.variants:
                row["main_s"] += sec
                if count.task == "choice" and v in plan.replaced:
                    row["replacements_s"] += plan.replacements * sec
            if s in plan.seed_suites:
                row["seeds_s"] += plan.seed_runs.get(v, 0) * sec
        row["total_s"] = row["main_s"] + row["replacements_s"] + row["seeds_s"]
        out[v] = row
    return out


def estimate(counts: list[SuiteCount], figures: Figures, train: dict[str, TrainPlan], score: ScorePlan,
             pool_sizes: dict[str, int] = COCO_2017) -> dict[str, Any]:  # fmt: skip
    """Seconds and hours of extract (per suite, then the rows suites share counted once),
    train and score (per variant), and their total."""
    rows = [{"suite": c.suite, "images": c.images, "captions": c.captions,
             "seconds": c.images * figures.s_per_image + c.captions * figures.s_per_caption}
            for c in counts]  # fmt: skip
    images, captions = encoded_rows(counts, pool_sizes)
    shared_images = images - sum(c.images for c in counts)  # <= 0: rows another suite wrote
    shared_captions = captions - sum(c.captions for c in counts)
    shared_s = shared_images * figures.s_per_image + shared_captions * figures.s_per_caption
    extract_s = images * figures.s_per_image + captions * figures.s_per_caption
    training = {v: training_seconds(p, figures.train[v]) for v, p in train.items()}
    scoring = scoring_seconds(score, counts, figures)
    train_s = sum(t["total_s"] for t in training.values())
    score_s = sum(s["total_s"] for s in scoring.values())
    total_s = extract_s + train_s + score_s
    return {
        "extract": {"suites": rows, "shared_images": shared_images, "shared_captions": shared_captions,
                    "shared_seconds": shared_s, "images": images, "captions": captions,
                    "seconds": extract_s, "hours": extract_s / HOUR},
        "train": {"variants": training, "seconds": train_s, "hours": train_s / HOUR},
        "score": {"variants": scoring, "seconds": score_s, "hours": score_s / HOUR},
        "total_seconds": total_s,
        "total_hours": total_s / HOUR,
    }  # fmt: skip


# ---------------------------------------------------------------------------- plans from the params


def train_plans(params: Path, counts: list[SuiteCount]) -> dict[str, TrainPlan]:
    """Every variant of ``train.variants``: its seeds, steps, batch and dev rows."""
    from pipeline.benchmarks.base import SuiteSelection
    from pipeline.config import load_train_config, train_variants

    by_suite = {c.suite: c for c in counts}
    plans = {}
    for v in train_variants(params):
        cfg = load_train_config(params, v)
        dev = by_suite[SuiteSelection.parse(cfg.dev_suite).suite]
        dev_items = dev.items if dev.dev_items is None else dev.dev_items
        train = SuiteSelection.parse(cfg.train_suite)
        rows = by_suite[train.suite].items if train.suite in by_suite else 0
        train_items = round(rows * split_share(train.value)) if train.column == "split" else rows
        plans[v] = TrainPlan(
            len(cfg.seeds), cfg.steps, cfg.batch_size, cfg.eval_every,
            _cap(dev_items, cfg.dev_items), _cap(train_items, cfg.train_items),
        )  # fmt: skip
    return plans


def _cap(rows: int, cap: int | None) -> int:
    """How many of ``rows`` a seeded sample of at most ``cap`` keeps."""
    return rows if cap is None else min(rows, cap)


def score_plan(params: Path, kinds: dict[str, ScorerKind]) -> ScorePlan:
    """The ``score`` section as a :class:`ScorePlan`; a seed variant's seed runs are its seeds
    but the first, whose outputs the stage copies from the main run."""
    from pipeline.benchmarks import SUITES
    from pipeline.config import ScoreConfig, load_config, load_train_config
    from pipeline.scorers.checkpoints import checkpoint_owner

    cfg = load_config(ScoreConfig, params, "score")
    seeds = {
        v: len(load_train_config(params, checkpoint_owner(v)).seeds) - 1 for v in cfg.seed_variants
    }
    return ScorePlan(
        variants=list(cfg.variants), suites=list(cfg.suites), kinds=kinds,
        references={s: SUITES.get(s).pairwise_reference for s in cfg.suites},
        replaced=cfg.replaced, replacements=len(cfg.replacements), seed_runs=seeds,
        seed_suites=list(cfg.seed_suites or cfg.suites),
    )  # fmt: skip


# ---------------------------------------------------------------------------- measurements


def _timed_batches(fn, items: list, batch: int) -> tuple[list[dict[str, float]], list]:
    """``fn`` over ``items`` in batches: each batch's size and seconds, and its outputs."""
    runs, outs = [], []
    for s in range(0, len(items), batch):
        chunk = items[s : s + batch]
        t0 = time.perf_counter()
        outs.append(fn(chunk))
        runs.append({"n": len(chunk), "s": round(time.perf_counter() - t0, 3)})
    return runs, outs


def _per_item(runs: list[dict[str, float]]) -> float:
    return sum(r["s"] for r in runs) / sum(r["n"] for r in runs)


def _cat(parts: list):
    """Feature dataclasses (``ImageFeatures`` / ``TextFeatures``) concatenated along rows."""
    import torch

    fields = dataclasses.fields(parts[0])
    return type(parts[0])(
        **{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields}
    )


def measure_encoder(
    n_images: int, image_batch: int, n_captions: int, caption_batch: int, device: str = "cpu"
):
    """Seconds per image and per caption of ViT-L-14-336 at random init on ``device``.
    Returns the figures, the encoder, and the image and text features it produced (rounded to
    the store's dtypes and on the host, as a store read returns them) with the timed
    captions. A batch's time runs from reading its images (or tokenising its captions) to its
    features on the host."""
    from pipeline.encoders import open_clip_config
    from pipeline.features import to_device
    from pipeline.manifests import read_manifest
    from pipeline.perf.common import load_pixels, make_suite, random_encoder
    from pipeline.perf.scoring import fresh_image_features, fresh_text_features

    t0 = time.perf_counter()
    enc = random_encoder(MODEL)
    enc.model.to(device)
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        n_suite = max(image_batch + n_images, -(-(caption_batch + n_captions) // 2))  # 2 captions an image
        manifest = read_manifest(make_suite(Path(tmp), n_suite, enc.preprocess_cfg["size"][0]))
        names = manifest["image"].tolist()
        warm = load_pixels(enc, root, names[:image_batch]).to(device)
        to_device(fresh_image_features(enc.encode_images(warm)), "cpu")  # warm-up

        def encode_images(batch: list[str]):
            pixels = load_pixels(enc, root, batch).to(device)
            return to_device(fresh_image_features(enc.encode_images(pixels)), "cpu")

        image_runs, images = _timed_batches(
            encode_images, names[image_batch : image_batch + n_images], image_batch
        )
    captions = [c for cs in manifest["captions"] for c in cs]
    enc.encode_texts(enc.tokenizer(captions[:caption_batch]).to(device))  # warm-up

    def encode_texts(batch: list[str]):
        ids = enc.tokenizer(batch).to(device)
        return to_device(fresh_text_features(ids, enc.encode_texts(ids)), "cpu")

    timed = captions[caption_batch : caption_batch + n_captions]
    caption_runs, texts = _timed_batches(encode_texts, timed, caption_batch)
    figures = {
        "model": MODEL, "open_clip_config": open_clip_config(enc.spec, enc.spec.default_pretrained),
        "weights": "random init", "image_size": list(enc.preprocess_cfg["size"]), "grid": list(enc.dims.grid),
        "early_layer": enc.spec.early_layer, "build_s": round(build_s, 1),
        "s_per_image": _per_item(image_runs), "image_batches": image_runs,
        "s_per_caption": _per_item(caption_runs), "caption_batches": caption_runs,
    }  # fmt: skip
    return figures, enc, _cat(images), _cat(texts), timed


class _SuiteInMemory:
    """The part of :class:`pipeline.cache.FeatureStore` a family's ``load`` reads
    (:func:`pipeline.training.pairs.load_pairs`): one suite's manifest file, index and
    features, held in memory."""

    def __init__(self, dims, manifest_path: Path, index: dict, images, texts) -> None:
        self.dims, self.path, self.manifest_path, self.index = dims, "memory", manifest_path, index
        self._images, self._texts = images, texts

    def suites(self) -> list[str]:
        return ["coco-families"]

    def suite_attrs(self, suite: str) -> dict[str, Any]:
        return {"manifest": str(self.manifest_path)}

    def suite_index(self, suite: str, manifest_sha256: str | None = None) -> dict:
        return {k: v.copy() for k, v in self.index.items()}

    def images(self, rows, grids: bool = True):
        import torch

        return self._images.index(torch.as_tensor(rows, dtype=torch.long))

    def texts(self, rows, grids: bool = True):
        import torch

        return self._texts.index(torch.as_tensor(rows, dtype=torch.long))


def family_suite(
    folder: Path, dims, images, texts, captions: list[str], n_train: int, n_dev: int
) -> _SuiteInMemory:
    """A coco-families-format suite of ``n_train`` train and ``n_dev`` validation items, each
    with its own image row and captions (the measured features, tiled): the families in turn,
    paraphrases on the geometric ones, two grounded words per positive caption."""
    import numpy as np
    import pandas as pd
    import torch

    from pipeline.benchmarks.coco_families import FAMILIES

    geometric = {"relative-geometry", "absolute-position", "depth", "vertical"}
    n = n_train + n_dev
    text_rows = np.arange(3 * n) % len(texts)  # item i: pos i, neg n + i, paraphrase 2n + i
    caps = [captions[r] for r in text_rows]
    rows = []
    for i in range(n):
        fam, words = FAMILIES[i % len(FAMILIES)], caps[i].split(" ")
        rows.append({
            "item_id": f"{fam}/{i}", "image": f"{i}.png", "captions": [caps[i], caps[n + i]], "correct": 0,
            "category": fam, "family": fam, "split": "train" if i < n_train else "validation",
            "paraphrase": caps[2 * n + i] if fam in geometric else None,
            "cf_image": None, "flip_image": None, "flip_captions": None,
            "ground_words": [words[1], words[4]], "ground_positions": [1, 4],
            "ground_boxes": [[0.05, 0.1, 0.45, 0.9], [0.55, 0.1, 0.95, 0.9]],
        })  # fmt: skip
    manifest = pd.DataFrame(rows)
    path = folder / "coco-families.parquet"
    manifest.to_parquet(path, index=False)
    index = {
        "image": np.arange(n)[:, None],  # [n, 1]
        "captions": np.stack([np.arange(n), n + np.arange(n)], 1),  # [n, 2]
        "paraphrase": np.where(manifest["paraphrase"].notna(), 2 * n + np.arange(n), -1)[:, None],
    }
    tiled = images.index(torch.as_tensor(np.arange(n) % len(images)))
    return _SuiteInMemory(dims, path, index, tiled, texts.index(torch.as_tensor(text_rows)))


def _synchronize(device: str) -> None:
    """Wait for the device's queued work, so a timer read after it includes that work."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure_training(
    params: Path, dims, proj, images, texts, captions: list[str], steps: int, n_dev: int,
    device: str = "cpu",
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per trainable variant: seconds per optimisation step at its batch size (after a warm-up
    step), and per dev item of its ``dev_metrics`` and ``select``, as the training loop runs
    them (``pipeline.training.loop.train_seed``: the scorer and the family's data moved to
    ``device`` once); exact scoring shortcuts off (``Scorer.full_path``), so the dev figures
    are those of a trained checkpoint."""
    import torch

    from pipeline.benchmarks.base import SuiteSelection
    from pipeline.config import load_train_config, train_variants
    from pipeline.features import to_device
    from pipeline.scorers import create_scorer
    from pipeline.training.loop import make_trainer

    cfgs = {v: load_train_config(params, v) for v in train_variants(params)}
    n_train = max(c.batch_size for c in cfgs.values())
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = family_suite(Path(tmp), dims, images, texts, captions, n_train, n_dev)
        for v, cfg in cfgs.items():
            trainer = make_trainer(cfg)
            train = to_device(trainer.load(store, cfg.train_suite, train=True), device)
            dev = to_device(trainer.load(store, cfg.dev_suite, train=False), device)
            torch.manual_seed(0)
            model = create_scorer(cfg.variant, dims=dims, proj=proj, **cfg.scorer).full_path()
            model.to(device)
            params_ = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params_, lr=cfg.lr, weight_decay=cfg.weight_decay)
            gen = torch.Generator().manual_seed(0)
            model.train()
            times = []
            for k in range(1 + steps):  # a warm-up step, then the timed ones
                batch = torch.randperm(trainer.n_items(train), generator=gen)[: cfg.batch_size]
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    loss, _ = trainer.loss(model, train, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                _synchronize(device)
                if k:
                    times.append(round(time.perf_counter() - t0, 3))
            model.eval()
            suite = SuiteSelection.parse(cfg.dev_suite).suite
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                t0 = time.perf_counter()
                trainer.dev_metrics(model, dev, suite)
                _synchronize(device)
                t1 = time.perf_counter()
                trainer.select(model, dev, suite)
                _synchronize(device)
                t2 = time.perf_counter()
            out[v] = {"batch_size": cfg.batch_size, "step_s": times, "s_per_step": sum(times) / len(times),
                      "dev_items": n_dev, "dev_s_per_item": (t1 - t0) / n_dev,
                      "select_s_per_item": (t2 - t1) / n_dev}  # fmt: skip
    return out


def measure_scoring(
    variants: list[str],
    options: dict[str, dict],
    dims,
    proj,
    images,
    texts,
    gallery: int,
    choice_items: int,
    device: str = "cpu",
):
    """Each variant's :class:`ScorerKind`; ``score_matrix`` pairs per second over ``gallery``
    images x ``gallery`` captions for every per-caption scorer the retrieval suite runs
    (rerankers' bases included); in-memory choice pairs per second over ``choice_items``
    2-option items (``option_scores``). Random init with every exact shortcut off
    (``Scorer.full_path``: the method's cost, not its weights'), each after a 2-item warm-up.
    Scorers and features on ``device``, as the score stage puts them (``score.device``); a
    rate includes the device's work (synchronised before the timer is read)."""
    import torch

    from pipeline.features import to_device
    from pipeline.scorers import create_scorer, option_scores

    def build(v: str):
        torch.manual_seed(0)
        scorer = create_scorer(v, dims=dims, proj=proj, **options.get(v, {}))
        return scorer.eval().full_path().to(device)

    scorers = {v: build(v) for v in variants}
    kinds = {
        v: ScorerKind(s.pairwise, s.reranker, s.scores_choices, s.base if s.reranker else None)
        for v, s in scorers.items()
    }
    for base in {k.base for k in kinds.values() if k.reranker} - set(scorers):
        scorers[base] = build(base)
    two = torch.arange(2)
    images, texts = to_device(images, device), to_device(texts, device)
    img = images.index(torch.arange(choice_items) % len(images))
    opts = [texts.index(torch.arange(j, j + 2 * choice_items, 2) % len(texts)) for j in (0, 1)]
    g = images.index(torch.arange(gallery) % len(images))
    q = texts.index(torch.arange(gallery) % len(texts))
    matrix, choice = {}, {}
    with torch.no_grad():
        for v, scorer in scorers.items():
            if scorer.reranker:
                continue
            if v in variants:
                option_scores(scorer, img.index(two), [o.index(two) for o in opts])  # warm-up
                _synchronize(device)
                t0 = time.perf_counter()
                option_scores(scorer, img, opts)
                _synchronize(device)
                choice[v] = 2 * choice_items / (time.perf_counter() - t0)
            if not scorer.pairwise:
                scorer.score_matrix(g.index(two), q.index(two))  # warm-up
                _synchronize(device)
                t0 = time.perf_counter()
                scorer.score_matrix(g, q)
                _synchronize(device)
                matrix[v] = gallery * gallery / (time.perf_counter() - t0)
    return kinds, matrix, choice


def read_benches() -> dict[str, Any]:
    """The figures of ``reports/bench/{scoring,rerank,extract}.json`` the estimate uses."""
    scoring, rerank, extract = (
        json.loads((BENCH / f"{n}.json").read_text()) for n in ("scoring", "rerank", "extract")
    )
    vit = scoring["results"][MODEL]
    return {
        "scoring.json": {
            "command": scoring["command"], "n_items": vit["n_items"], "threads": vit["threads"],
            "load_avg_1min": vit["load_avg_1min"],
            "pairs_per_s": {v: r["pairs_per_s"] for v, r in vit["variants"].items()},
            "pairs": {v: r["pairs"] for v, r in vit["variants"].items()},
        },
        "rerank.json": {
            "command": rerank["command"], "setup": rerank["results"]["setup"],
            "ms_per_query": {v: r["ms_per_query"] for v, r in rerank["results"]["variants"].items()},
        },
        "extract.json": {"command": extract["command"], MODEL: extract["results"].get(MODEL, {})},
    }  # fmt: skip


def measure_all(args) -> dict[str, Any]:
    """Every measured figure (see the module docstring), with the machine's state."""
    import torch

    from pipeline.config import ScoreConfig, load_config
    from pipeline.features import Projections

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    encoder, enc, images, texts, captions = measure_encoder(
        args.images, args.image_batch, args.captions, args.caption_batch, args.device
    )
    m = enc.model
    proj = Projections(
        m.visual.proj.detach().cpu().clone(),
        m.text_projection.detach().cpu().clone(),
        m.logit_scale.exp().detach().cpu().clone(),
    )
    dims = enc.dims
    del enc, m
    training = measure_training(
        args.params, dims, proj, images, texts, captions, args.train_steps, args.dev_items,
        args.device,
    )  # fmt: skip
    score = load_config(ScoreConfig, args.params, "score")
    kinds, matrix, choice = measure_scoring(
        list(score.variants),
        score.options,
        dims,
        proj,
        images,
        texts,
        args.gallery,
        args.choice_items,
        args.device,
    )
    device = torch.device(args.device)
    return {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": args.threads, "cpus": os.cpu_count(), "torch": torch.__version__,
        "load_avg_1min_start": round(load_start, 2), "load_avg_1min_end": round(os.getloadavg()[0], 2),
        "measure_s": round(time.perf_counter() - t0, 1),
        "encoder": encoder, "dims": dataclasses.asdict(dims), "train": training,
        "kinds": {v: dataclasses.asdict(k) for v, k in kinds.items()},
        "retrieval_pairs_per_s": matrix, "score_matrix_gallery": args.gallery,
        "choice_pairs_per_s_in_memory": choice, "choice_items": args.choice_items,
    }  # fmt: skip


# ---------------------------------------------------------------------------- assembly and output


def option_differences(command: str, params: Path, variants) -> dict[str, tuple[dict, dict]]:
    """Of ``variants``, those whose scorer options (``train.<owner>.scorer``) differ between the
    params a bench ``command`` names (``--params``) and ``params``: {variant: (bench's, params')}."""
    import re

    from pipeline.config import load_train_config, train_variants
    from pipeline.scorers.checkpoints import checkpoint_owner

    found = re.search(r"--params\s+(\S+)", command)
    bench = REPO / found.group(1) if found else None
    if bench is None or not bench.is_file():
        return {}
    shared = set(train_variants(bench)) & set(train_variants(params))
    out = {}
    for v in variants:
        owner = checkpoint_owner(v)
        if owner in shared:
            a, b = load_train_config(bench, owner).scorer, load_train_config(params, owner).scorer
            if a != b:
                out[v] = (a, b)
    return out


def figures_from(
    measured: dict[str, Any], benches: dict[str, Any], variants: list[str], cache_rates: bool = True
) -> tuple[Figures, dict[str, str]]:
    """The figures the estimate uses and, per variant, where its choice rate comes from:
    scoring.json's rates from the cache where ``cache_rates`` (they are CPU figures), else the
    in-memory rates ``measured`` holds."""
    bench = benches["scoring.json"]["pairs_per_s"] if cache_rates else {}
    memory = measured["choice_pairs_per_s_in_memory"]
    choice, source = {}, {}
    for v in variants:
        if v in bench:
            choice[v], source[v] = bench[v], "scoring.json"
        elif v in memory:
            choice[v], source[v] = (
                memory[v],
                "measured in memory (the variant is not in scoring.json)",
            )
    rerank = {v: ms / 1000 for v, ms in benches["rerank.json"]["ms_per_query"].items()}
    keys = ("s_per_step", "dev_s_per_item", "select_s_per_item")
    train = {v: {k: t[k] for k in keys} for v, t in measured["train"].items()}
    enc = measured["encoder"]
    figures = Figures(
        enc["s_per_image"],
        enc["s_per_caption"],
        train,
        choice,
        measured["retrieval_pairs_per_s"],
        rerank,
    )
    return figures, source


def memory_notes(counts: list[SuiteCount], est: dict[str, Any], dims: dict[str, Any], plans: dict[str, TrainPlan]) -> list[str]:
    """Disk and memory the run needs, from the cache schema's row sizes."""
    import numpy as np

    from pipeline.cache.schema import IMAGE_ARRAYS, TEXT_ARRAYS, resolve_tail
    from pipeline.scoring import GALLERY_BYTES

    def row_bytes(specs, names=None) -> int:
        return sum(int(np.prod(resolve_tail(s, dims), dtype=np.int64)) * np.dtype(s.dtype).itemsize
                   for s in specs if names is None or s.name in names)  # fmt: skip

    gb = 1e9
    image_b, text_b = row_bytes(IMAGE_ARRAYS), row_bytes(TEXT_ARRAYS)
    grids = row_bytes(IMAGE_ARRAYS, ("image/early", "image/final"))  # fp16
    images, captions = est["extract"]["images"], est["extract"]["captions"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / gb
    notes = [
        f"feature store: {images:,} image rows x {image_b / 1e6:.2f} MB + {captions:,} text rows x "
        f"{text_b / 1e6:.3f} MB = {(images * image_b + captions * text_b) / gb:,.0f} GB on disk (the "
        f"schema's row sizes, grids uncompressed); this machine has {ram:.0f} GB of memory"
    ]  # fmt: skip
    text_grid = row_bytes(TEXT_ARRAYS, ("text/tokens",))  # fp16
    pair_b = grids + 2 * text_grid  # one item's image and its two captions, fp16
    for v, plan in plans.items():
        items = plan.train_items + plan.dev_items
        notes.append(
            f"train {v}: holds its {plan.train_items:,} training and {plan.dev_items:,} dev items' "
            f"features in memory (load_pairs, fp16; train.train_items / train.dev_items cap them): "
            f"at most {items:,} x {pair_b / 1e6:.2f} MB = {items * pair_b / gb:,.1f} GB"
        )  # fmt: skip
    for c in counts:
        if c.task == "retrieval" and c.suite != "coco-objects-train":
            notes.append(
                f"{c.suite}: a grid scorer reads its {c.images:,}-image gallery in blocks of at most "
                f"{GALLERY_BYTES / gb:.1f} GB of float32 grids (gallery_scores; {2 * grids / 1e6:.2f} MB an image)"
            )  # fmt: skip
    return notes


def _h(seconds: float) -> str:
    """Hours, to a precision that suits their size."""
    h = seconds / HOUR
    if abs(h) >= 100:
        return f"{h:,.0f}"
    if abs(h) >= 1:
        return f"{h:,.1f}"
    return f"{h:.2f}" if abs(h) >= 0.01 else "<0.01"


def markdown(
    counts: list[SuiteCount], est: dict[str, Any], train: dict[str, TrainPlan], figures: Figures,
    gpu: dict[str, Any] | None = None, gpu_name: str = "GPU",
) -> str:  # fmt: skip
    """The estimate as one Markdown table: CPU hours on this machine and, where ``gpu`` (the
    estimate from figures measured on a GPU) is given, GPU hours; else 'not measured'."""

    def g(seconds, bold: bool = False) -> str:  # the GPU cell: ``seconds`` picks it out of an estimate
        if gpu is None:
            return NO_GPU
        return f"**{_h(seconds(gpu))}**" if bold else _h(seconds(gpu))

    ext = est["extract"]
    lines = [
        f"| part | images | captions | CPU hours (this machine) | GPU hours{'' if gpu is None else f' ({gpu_name})'} |",
        "|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for i, (row, c) in enumerate(zip(ext["suites"], counts, strict=True)):
        le = "" if c.exact else "≤ "
        if c.source.startswith(UNCOUNTED):
            lines.append(
                f"| extract: {c.suite} | {UNCOUNTED} | {UNCOUNTED} | {UNCOUNTED} | {UNCOUNTED} |"
            )
            continue
        lines.append(f"| extract: {c.suite} | {le}{c.images:,} | {le}{c.captions:,} | {_h(row['seconds'])} | "
                     f"{g(lambda e, i=i: e['extract']['suites'][i]['seconds'])} |")  # fmt: skip
    if ext["shared_images"] or ext["shared_captions"]:
        lines.append(f"| extract: rows another suite already wrote (encoded once) | {ext['shared_images']:,} | "
                     f"{ext['shared_captions']:,} | {_h(ext['shared_seconds'])} | {g(lambda e: e['extract']['shared_seconds'])} |")  # fmt: skip
    lines.append(f"| **extract total** | {ext['images']:,} | {ext['captions']:,} | **{_h(ext['seconds'])}** | "
                 f"{g(lambda e: e['extract']['seconds'], bold=True)} |")  # fmt: skip
    for v, t in est["train"]["variants"].items():
        p = train[v]
        what = (f"{p.seeds} seeds × {p.steps} steps × {figures.train[v]['s_per_step']:.2g} s (batch {p.batch_size}) on {p.train_items:,} training items, "
                f"{t['dev_evals_per_seed']} dev evaluations + select on {p.dev_items:,} dev items a seed")  # fmt: skip
        lines.append(f"| train: {v} ({what}) | | | {_h(t['total_s'])} | {g(lambda e, v=v: e['train']['variants'][v]['total_s'])} |")
    lines.append(f"| **train total** | | | **{_h(est['train']['seconds'])}** | {g(lambda e: e['train']['seconds'], bold=True)} |")
    gpu_nm = NO_GPU if gpu is None else NOT_MEASURED
    lines.append(
        f"| ridge (ridge-fgw's map on coco-objects-train) | | | {NOT_MEASURED} | {gpu_nm} |"
    )
    for v, s in est["score"]["variants"].items():
        what = f"main {_h(s['main_s'])} h, image replacements {_h(s['replacements_s'])} h, other seeds {_h(s['seeds_s'])} h"
        lines.append(f"| score: {v} ({what}) | | | {_h(s['total_s'])} | {g(lambda e, v=v: e['score']['variants'][v]['total_s'])} |")
    lines.append(f"| **score total** | | | **{_h(est['score']['seconds'])}** | {g(lambda e: e['score']['seconds'], bold=True)} |")
    lines.append(f"| manifests, report | | | {NOT_MEASURED} | {gpu_nm} |")
    lines.append(f"| **total of the measured parts** | | | **{_h(est['total_seconds'])}** | "
                 f"{g(lambda e: e['total_seconds'], bold=True)} |")  # fmt: skip
    return "\n".join(lines)


def build_report(
    measured: dict[str, Any], params: Path, gpu: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Counts, plans and the estimate from the measured figures: the results JSON. ``gpu``
    (figures measured with ``--device cuda``) adds a GPU estimate beside the CPU one."""
    benches = read_benches()
    kinds = {v: ScorerKind(**k) for v, k in measured["kinds"].items()}
    counts = count_suites(params)
    plan = score_plan(params, kinds)
    train = train_plans(params, counts)
    figures, choice_source = figures_from(measured, benches, plan.variants)
    est = estimate(counts, figures, train, plan)
    enc, sj = measured["encoder"], benches["scoring.json"]
    memory = dataclasses.replace(
        figures, choice_pairs_per_s=measured["choice_pairs_per_s_in_memory"]
    )
    score_in_memory = sum(r["total_s"] for r in scoring_seconds(plan, counts, memory).values())
    est_gpu, gpu_notes = None, []
    if gpu is not None:
        gpu_figures, _ = figures_from(gpu, benches, plan.variants, cache_rates=False)
        est_gpu = estimate(counts, gpu_figures, train, plan)
        genc = gpu["encoder"]
        gpu_notes = [
            f"GPU figures: measured on {gpu['device_name']} ({gpu['device']}, torch {gpu['torch']}, host "
            f"{gpu['cpus']} cores, {gpu['threads']} torch threads) by `{gpu['command']}`: "
            f"{genc['s_per_image'] * 1000:.1f} ms per image ({sum(r['n'] for r in genc['image_batches'])} images "
            f"in batches of {genc['image_batches'][0]['n']}: reading, decoding and preprocessing on the host, "
            f"the forward on the GPU, the features back on the host) and {genc['s_per_caption'] * 1000:.2f} ms "
            f"per caption (batches of {genc['caption_batches'][0]['n']})",
            "GPU choice and retrieval scoring use that run's in-memory rates on the GPU (scoring.json's rates "
            "from the cache are CPU figures): store reads are not in them; the rerankers' cost per query is "
            "rerank.json's CPU figure (their solvers run on the host)",
        ]  # fmt: skip
    not_measured = [
        "GPU: no GPU lent to this session, so every GPU figure reads 'not measured (no GPU lent)'"
        if gpu is None else "GPU: the ridge, manifests and report stages, and store reads",
        "ridge stage: no bench times the ridge fit (closed form over every coco-objects-train object, after reading those images' grids)",
        "manifests stage (official files to Parquet, with the ARO Order perturbations) and report stage (bootstrap CIs): no bench times them on real data",
        "reading the training and dev features from the store (load_pairs), and the score stage's store reads beyond those in scoring.json's rates",
        "the geometry rerankers at ViT-L-14-336 dimensions: rerank.json is measured at the toy's (read.rerank.json.setup)",
        *(f"suite {c.suite}: {c.source}" for c in counts if c.source.startswith(UNCOUNTED)),
    ]  # fmt: skip
    notes = [
        f"per-image and per-caption figures: {sum(r['n'] for r in enc['image_batches'])} images in batches of "
        f"{enc['image_batches'][0]['n']} and {sum(r['n'] for r in enc['caption_batches'])} captions in batches of "
        f"{enc['caption_batches'][0]['n']}, {measured['threads']} torch threads, 1-min load average "
        f"{measured['load_avg_1min_start']} at the start and {measured['load_avg_1min_end']} at the end on "
        f"{measured['cpus']} cores (other processes slow every figure)",
        f"choice scoring uses scoring.json's ViT-L-14-336 rates (store reads included), measured on "
        f"{sj['n_items']} items ({max(sj['pairs'].values())} pairs a variant, so fixed costs such as opening "
        f"the store weigh on few pairs) at a 1-min load average of {sj['load_avg_1min']}; "
        f"measured.choice_pairs_per_s_in_memory are this run's in-memory rates: with them for every "
        f"choice scorer, score would take {_h(score_in_memory)} h instead of {_h(est['score']['seconds'])} h",
        *(f"scoring.json's {v} was built with scorer options {a} (its params), the real run's are {b}: "
          f"its rate may not be the real run's" for v, (a, b) in option_differences(sj["command"], params, sj["pairs_per_s"]).items()),
        f"retrieval ({', '.join(f'{c.suite}: {c.items:,} queries x {c.images:,} images' for c in counts if c.task == 'retrieval' and c.suite in plan.suites)}) "
        f"uses this run's in-memory score_matrix rates (timed on {measured['score_matrix_gallery']} queries x {measured['score_matrix_gallery']} images), without store reads",
        "training figures use the random-init encoder's features; a solver that iterates to a tolerance "
        "(BindCLIP's Sinkhorn) may take another number of iterations on real features",
        "counts marked ≤ are upper bounds (documented sizes or the builders' structure; extract encodes a "
        "repeated caption once); coco-families' counts stay bounds until its manifest is built",
        *memory_notes(counts, est, measured["dims"], train),
        *gpu_notes,
    ]  # fmt: skip
    rel = params.relative_to(REPO) if params.is_relative_to(REPO) else params
    return {
        "params": str(rel),
        "measured": measured,
        "measured_gpu": gpu,
        "read": benches,
        "choice_rate_source": choice_source,
        "counts": [
            {k: v for k, v in dataclasses.asdict(c).items() if k not in ("keys", "texts")}
            for c in counts
        ],
        "train_plans": {v: dataclasses.asdict(p) for v, p in train.items()},
        "score_plan": {k: v for k, v in dataclasses.asdict(plan).items() if k != "kinds"},
        "estimate": {
            **est,
            "gpu": NO_GPU if est_gpu is None else est_gpu,
            "score_seconds_with_in_memory_choice_rates": score_in_memory,
        },
        "not_measured": not_measured,
        "notes": notes,
        "table_markdown": markdown(
            counts, est, train, figures, est_gpu, gpu["device_name"] if gpu else "GPU"
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--params",
        type=Path,
        default=PARAMS,
        help="the real run's params (default real/params.yaml)",
    )
    ap.add_argument(
        "--images", type=int, default=4, help="images timed after a one-image warm-up (default 4)"
    )
    ap.add_argument("--image-batch", type=int, default=2, help="images per forward (default 2)")
    ap.add_argument(
        "--captions", type=int, default=32, help="captions timed after a warm-up batch (default 32)"
    )
    ap.add_argument(
        "--caption-batch", type=int, default=16, help="captions per forward (default 16)"
    )
    ap.add_argument(
        "--train-steps",
        type=int,
        default=2,
        help="steps timed per variant after a warm-up step (default 2)",
    )
    ap.add_argument(
        "--dev-items",
        type=int,
        default=64,
        help="dev items the dev evaluation is timed on (default 64)",
    )
    ap.add_argument(
        "--gallery",
        type=int,
        default=24,
        help="images and captions of the timed score_matrix (default 24)",
    )
    ap.add_argument(
        "--choice-items",
        type=int,
        default=16,
        help="2-option items of the timed choice scoring (default 16)",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument(
        "--device",
        default="cpu",
        help="where to measure: cpu (default) gives the CPU column; cuda (or cuda:N) the GPU "
        "column, with the CPU figures taken from --reuse",
    )
    ap.add_argument(
        "--reuse",
        type=Path,
        help="take the measured figures (CPU, and GPU where it holds them) from this earlier output "
        "instead of measuring; with --device cuda, the CPU figures only",
    )
    ap.add_argument(
        "--out", type=Path, default=BENCH, help="folder of real-cost.json (default reports/bench)"
    )
    args = ap.parse_args(argv)
    args.params = args.params.resolve()
    if (
        min(args.images, args.image_batch, args.captions, args.caption_batch, args.train_steps) < 1
        or min(args.dev_items, args.gallery, args.choice_items) < 2
    ):
        ap.error(
            "--images, --captions, their batches and --train-steps must be >= 1; --dev-items, --gallery, --choice-items >= 2"
        )
    on_gpu = args.device != "cpu"
    if on_gpu and args.reuse is None:
        ap.error("--device cuda measures the GPU column only: name the CPU figures with --reuse "
                 "reports/bench/real-cost.json")  # fmt: skip
    measure_flags = (f"--images {args.images} --image-batch {args.image_batch} --captions {args.captions} "
                     f"--caption-batch {args.caption_batch} --train-steps {args.train_steps} --dev-items {args.dev_items} "
                     f"--gallery {args.gallery} --choice-items {args.choice_items} --threads {args.threads}")  # fmt: skip
    previous = None if args.reuse is None else json.loads(args.reuse.read_text())["results"]
    if on_gpu:
        flags = f"{measure_flags} --device {args.device} --reuse {args.reuse}"
        measured = previous["measured"]
        gpu = {"command": f"scripts/real_cost.py {measure_flags} --device {args.device}", **measure_all(args)}
    elif previous is not None:
        flags = f"--reuse {args.reuse}"
        measured, gpu = previous["measured"], previous.get("measured_gpu")
    else:
        flags = measure_flags
        measured = {"command": f".venv/bin/python scripts/real_cost.py {flags}", **measure_all(args)}
        gpu = None
    results = build_report(measured, args.params, gpu)
    from pipeline.perf.common import write_bench

    out = write_bench("real-cost", f".venv/bin/python scripts/real_cost.py {flags}", results, args.out)
    print(f"-> {out}", file=sys.stderr)
    enc = measured["encoder"]
    print(f"\n{MODEL} (random init, {measured['threads']} threads): {enc['s_per_image']:.2f} s per image, "
          f"{enc['s_per_caption']:.3f} s per caption")  # fmt: skip
    if gpu is not None:
        print(f"{MODEL} (random init, {gpu['device_name']}): {gpu['encoder']['s_per_image'] * 1000:.1f} ms per "
              f"image, {gpu['encoder']['s_per_caption'] * 1000:.2f} ms per caption")  # fmt: skip
    print()
    print(results["table_markdown"])
    print("\nCounts:\n" + "\n".join(f"* {c['suite']}: {c['source']}" for c in results["counts"]))
    print("\nNot measured:\n" + "\n".join(f"* {n}" for n in results["not_measured"]))
    print("\nNotes:\n" + "\n".join(f"* {n}" for n in results["notes"]))
    return results


if __name__ == "__main__":
    main()
