"""The suite contract and its registry.

Manifest contract (one row per test item, a pandas DataFrame stored as Parquet):

* ``item_id`` (str): unique within the suite.
* ``image`` (str): image path relative to the suite's image root.
* ``crop_box`` (optional, list[float] x0, y0, x1, y1 or None): crop applied before
  preprocessing (ARO VG-Relation/Attribution).
* ``captions`` (list[str]): the K caption options (K may vary across items).
* ``correct`` (int): index of the correct option in ``captions`` (choice tasks).
* ``category`` (str): the reporting group (SugarCrepe category, ARO subset, family ...), one
  of ``Suite.categories`` where the suite declares them.
* any suite-specific columns (group keys, boxes, flags such as ``length_matched``).

Extra image / caption columns that extract must also encode are named in
``Suite.image_columns`` / ``Suite.caption_columns`` (str or list[str] cells).

Scores contract: ``choice`` suites score an ``[n_items, K_max]`` float array, NaN where an
item has fewer options; ``retrieval`` suites score ``[n_queries, n_gallery]`` where the
gallery is ``gallery_images(manifest)`` in that order and each row's query is
``captions[0]`` with target ``image``.

Selections: a suite's rows can be narrowed by one manifest column, written
``suite[column=value]`` or ``suite[value]`` for the ``split`` column
(:class:`SuiteSelection`), e.g. ``coco-families[train]`` and ``coco-families[validation]``
for BindCLIP's image-disjoint training and development pairs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from pipeline.registry import Registry

SUITES: Registry[Suite] = Registry("suite", "pipeline.benchmarks")


@dataclass
class Units:
    """Per-unit values whose statistic is a metric, for bootstrap and McNemar.

    ``metric = mean(values)`` when ``groups`` is None, else the macro mean over groups of
    the per-group means (e.g. ARO VG-Relation). Units are items, or pairs/sets where the
    metric is defined on them (What'sUp pair/set accuracy).
    """

    values: np.ndarray  # [n_units] float (0/1 for accuracies)
    groups: np.ndarray | None = None  # [n_units] group label per unit, or None

    def statistic(self) -> float:
        if len(self.values) == 0:
            return float("nan")
        if self.groups is None:
            return float(np.mean(self.values))
        g = pd.Series(self.values).groupby(np.asarray(self.groups)).mean()
        return float(g.mean())


@dataclass(frozen=True)
class Suite:
    """One benchmark suite: how to build its manifest and how to score it officially.

    Attributes:
        name: registry key (kebab-case), e.g. ``shapes-whatsup``, ``aro-relation``.
        task: ``choice`` (pick a caption for an image) or ``retrieval`` (text -> image).
        build_manifest: ``root -> DataFrame``; reads the official files (or the world
            output) under ``root``; never opens images.
        units: ``(manifest, scores) -> {metric name: Units}``; the official metrics are
            the statistics of these units (see ``metrics``).
        metric_names: the metric names this suite reports, in display order.
        headline: the metric shown first in tables.
        description: one line for ``pipeline suites``.
        image_columns: manifest columns holding image paths to encode.
        caption_columns: manifest columns holding captions to encode.
        text_units: optional text-only metrics ``(manifest, unit caption embeddings
            [n, K, D]) -> {name: Units}`` (SugarCrepe++ TOT), computed from the frozen text
            encoder's pooled embeddings in the cache, the same for every scorer.
        pairwise_reference: the option a pairwise scorer's preferences are taken against
            on this suite's items: option k scores ``s(I, c_k, c_ref)`` and the reference
            itself 0 (:func:`pipeline.scorers.base.option_scores`), where the official test
            compares every other option with one (SugarCrepe++ ITT against N); None = the
            mean preference over the other options.
        categories: the ``category`` values a manifest of this suite may hold (the groups
            its metrics and reports are computed over); None = any value. An item outside
            them would drop out of every per-category figure unnoticed, so
            :meth:`check_manifest` refuses it.
        world: True for the shapes world's suites, whose manifests ``pipeline world``
            writes (real suites' come from ``pipeline manifest(s)``).
        category_files: True where each of :attr:`categories` is read from an official file
            of its own and a missing file is skipped (SugarCrepe, SugarCrepe++): the manifest
            records the categories present and missing (:meth:`category_coverage`), and the
            metrics files and the report name the missing ones, since the aggregates then
            pool fewer categories than the published ones.
        generated_options: True where the options are generated from each item's caption
            (ARO Order's word-order perturbations), so an option that reproduces the caption
            is part of the official benchmark and its tie is scored by the official rule,
            not a manifest error to fix.
    """

    name: str
    task: Literal["choice", "retrieval"]
    build_manifest: Callable[[Path], pd.DataFrame]
    units: Callable[[pd.DataFrame, np.ndarray], dict[str, Units]]
    metric_names: tuple[str, ...]
    headline: str
    description: str = ""
    text_units: Callable[[pd.DataFrame, np.ndarray], dict[str, Units]] | None = None
    image_columns: tuple[str, ...] = ("image",)
    caption_columns: tuple[str, ...] = ("captions",)
    extra: dict = field(default_factory=dict)
    pairwise_reference: int | None = None
    categories: tuple[str, ...] | None = None
    world: bool = False  # built by `pipeline world` into <world>/manifests/ (a shapes suite)
    category_files: bool = False  # one official file per category, a missing one skipped
    generated_options: bool = False  # options generated from the caption (ARO Order)

    def category_coverage(self, manifest: pd.DataFrame) -> dict[str, list[str]] | None:
        """``{"present": [...], "missing": [...]}``: which of :attr:`categories` ``manifest``
        holds, in their declared order, for a suite with :attr:`category_files`; None for any
        other suite (its categories are not files that can be absent)."""
        if not self.category_files or self.categories is None:
            return None
        held = set(manifest["category"].astype(str)) if "category" in manifest else set()
        return {
            "present": [c for c in self.categories if c in held],
            "missing": [c for c in self.categories if c not in held],
        }

    def check_manifest(self, manifest: pd.DataFrame, where: str) -> None:
        """Refuse a manifest this suite cannot score correctly, naming ``where`` (the file),
        the column and the first bad item: a missing column; no item at all; a null or repeated ``item_id``
        (an item without a name cannot be reported, a repeated one would count twice); a
        ``category`` outside :attr:`categories` (the item would fall out of every
        per-category metric while still counting in the totals); an ``image`` that is not a
        non-empty path (a null would be counted as a missing image); ``captions`` not a list
        of at least two options for a choice item (a bare string or one caption would count
        as right by construction) or not one query for a retrieval row; a ``correct`` that is
        null or not an integer index into its row's captions (-1 would silently pick the
        last). One null ``correct`` turns the whole Parquet column into floats, so the null
        rows are named before the column's type is."""
        from pipeline.manifests import check_unique_ids

        need = ["item_id", "image", "captions", "category"] + (["correct"] if self.task == "choice" else [])
        absent = [c for c in need if c not in manifest]
        if absent:
            raise ValueError(f"{where}: no column {', '.join(absent)} (a {self.name} manifest needs {', '.join(need)})")
        if manifest.empty:  # every metric would be NaN
            raise ValueError(f"{where}: the manifest has no items; rebuild it (a {self.name} manifest needs at least one)")
        check_unique_ids(manifest, where)
        ids = manifest["item_id"].astype(str).to_numpy()

        def bad(mask: np.ndarray, what: str) -> None:
            if mask.any():
                k = int(np.flatnonzero(mask)[0])
                raise ValueError(f"{where}: item {ids[k]}: {what} ({int(mask.sum())} item(s) in all)")

        if self.categories is not None:
            category = manifest["category"]
            outside = ~category.astype(str).isin(self.categories).to_numpy() | category.isna().to_numpy()
            if outside.any():
                rows = np.flatnonzero(outside)
                null = category.isna().to_numpy()
                shown = ", ".join(f"{ids[k]}: {'null' if null[k] else repr(category.iloc[k])}" for k in rows[:3])
                shown += " ..." if len(rows) > 3 else ""
                raise ValueError(
                    f"{where}: {len(rows)} item(s) have a category that is not one of {self.name}'s "
                    f"({shown}); valid categories: {', '.join(self.categories)}; fix the category column"
                )
        image = manifest["image"].to_numpy(dtype=object)
        bad(np.array([not (isinstance(v, str) and v.strip()) for v in image], dtype=bool), "image must be a non-empty path")
        caps = manifest["captions"].to_numpy(dtype=object)
        is_list = np.array([isinstance(c, list | tuple | np.ndarray) for c in caps], dtype=bool)
        bad(~is_list, "captions must be a list of caption strings")
        n = np.array([len(c) for c in caps], dtype=np.int64)
        if self.task == "retrieval":
            bad(n != 1, "captions must hold exactly one query")
            return
        bad(n < 2, "captions must hold at least two options")
        bad(manifest["correct"].isna().to_numpy(), "correct is null; it must be an integer index into captions")
        correct = manifest["correct"].to_numpy(dtype=object)
        if pd.api.types.is_integer_dtype(manifest["correct"]):
            integral = np.ones(len(correct), dtype=bool)
        else:  # an object column may mix ints with strings, floats or booleans
            integral = np.array([isinstance(c, int | np.integer) and not isinstance(c, bool) for c in correct], dtype=bool)
        bad(~integral, "correct must be an integer index into captions")
        index = correct.astype(np.int64)
        bad((index < 0) | (index >= n), "correct must index its captions (0 .. n_captions - 1)")

    def metrics(self, manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, float]:
        """The official metrics ``{name: value}`` (accuracies in [0, 1])."""
        units = self.units(manifest, scores)
        return {name: units[name].statistic() for name in self.metric_names if name in units}


def gallery_images(manifest: pd.DataFrame) -> list[str]:
    """Retrieval gallery: the unique ``image`` values in first-appearance order."""
    return list(dict.fromkeys(manifest["image"].tolist()))


def extracted_items(index: dict[str, np.ndarray]) -> np.ndarray:
    """[n] bool: the suite's items every image of which was extracted (an image skipped at
    extract, missing or unreadable, has row -1): the items a suite is scored on."""
    image = np.asarray(index["image"])
    return (image >= 0).all(axis=1) if image.ndim == 2 else image >= 0


def choice_correct(
    scores: np.ndarray, correct: np.ndarray, ties: Literal["first", "wrong"]
) -> np.ndarray:
    """[n] bool: whether the correct option wins.

    Args:
        scores: [n, K] option scores, NaN for absent options.
        correct: [n] index of the correct option.
        ties: ``first`` = ``np.argmax`` semantics (first maximal index wins, as the ARO and
            What'sUp code); ``wrong`` = the correct option must be strictly greater than
            every other option (SugarCrepe's strict ``>``).
    """
    s = np.where(np.isnan(scores), -np.inf, scores)
    n = np.arange(len(s))
    if not len(s):  # no item scored: np.argmax refuses an empty row axis
        return np.zeros(0, dtype=bool)
    if ties == "first":
        return np.argmax(s, axis=1) == correct
    c = s[n, correct]
    others = s.copy()
    others[n, correct] = -np.inf
    return c > others.max(axis=1)


# --------------------------------------------------------------------------------------
# Splits shared by the loaders.


SPLIT_COLUMN = "split"  # the column ``suite[value]`` selects on


@dataclass(frozen=True)
class SuiteSelection:
    """A suite, or the rows of it whose manifest ``column`` equals ``value``.

    Written ``suite``, ``suite[value]`` (column :data:`SPLIT_COLUMN`) or
    ``suite[column=value]``: one string, so a selection goes wherever a suite name goes
    (``train.<variant>.train_suite`` / ``dev_suite``) and the suite's store index and
    manifest stay one per suite. The row filter compares the cell's ``str`` with ``value``.

    ``sample`` keeps a seeded random subset of that many of the selected rows (all of them
    when there are fewer): the training loop's ``train_items`` / ``dev_items`` caps, which
    bound a large suite's training memory and dev-evaluation time. The subset depends only
    on the selected rows and ``sample_seed``, so every training seed sees the same items.
    """

    suite: str  # registry key of the suite
    column: str | None = None  # manifest column the rows are selected on; None = every row
    value: str | None = None  # the column value of the selected rows
    sample: int | None = None  # keep a seeded random sample of this many selected rows; None = all
    sample_seed: int = 0  # the sample's seed

    _PATTERN = re.compile(r"([a-z0-9]+(?:-[a-z0-9]+)*)(?:\[(?:([A-Za-z_]\w*)=)?([^\[\]=]+)\])?")

    @classmethod
    def parse(cls, text: str | SuiteSelection) -> SuiteSelection:
        """``suite`` | ``suite[value]`` | ``suite[column=value]`` -> the selection (a
        selection is returned as it is).

        Raises:
            ValueError: naming ``text`` and the accepted forms when it matches none.
        """
        if isinstance(text, SuiteSelection):
            return text
        m = cls._PATTERN.fullmatch(str(text).strip())
        if m is None:
            raise ValueError(
                f"suite selection {text!r} is not one of: suite, suite[value] "
                f"(the {SPLIT_COLUMN!r} column), suite[column=value]"
            )
        suite, column, value = m.groups()
        if value is None:
            return cls(suite)
        return cls(suite, column or SPLIT_COLUMN, value.strip())

    def sampled(self, n: int | None, seed: int = 0) -> SuiteSelection:
        """This selection cut to a seeded sample of ``n`` rows (``None``: every row)."""
        if n is not None and n < 1:
            raise ValueError(f"{self}: a sample needs at least one row, got {n}")
        return dataclasses.replace(self, sample=n, sample_seed=seed)

    def __str__(self) -> str:
        if self.column is None:
            return self.suite
        if self.column == SPLIT_COLUMN:
            return f"{self.suite}[{self.value}]"
        return f"{self.suite}[{self.column}={self.value}]"

    def describe(self) -> str:
        """The selection as written, with its sample when it has one."""
        if self.sample is None:
            return str(self)
        return f"{self} (a sample of at most {self.sample:,} rows, seed {self.sample_seed})"

    def mask(self, manifest: pd.DataFrame) -> np.ndarray:
        """[n] bool: the manifest rows the selection keeps (all of them without a column),
        cut to ``sample`` of them when the selection has a sample.

        Raises:
            ValueError: when the manifest has no such column (naming its columns) or no row
                has the value (naming the values it has).
        """
        keep = self._filter(manifest)
        if self.sample is None or keep.sum() <= self.sample:
            return keep
        chosen = np.random.default_rng(self.sample_seed).choice(np.flatnonzero(keep), self.sample, replace=False)
        keep = np.zeros(len(manifest), dtype=bool)
        keep[chosen] = True
        return keep

    def _filter(self, manifest: pd.DataFrame) -> np.ndarray:
        if self.column is None:
            return np.ones(len(manifest), dtype=bool)
        if self.column not in manifest:
            raise ValueError(
                f"{self}: {self.suite} has no column {self.column!r}; "
                f"columns: {', '.join(map(str, manifest.columns))}"
            )
        cells = manifest[self.column].astype(str).to_numpy()
        keep = cells == self.value
        if not keep.any():
            raise ValueError(
                f"{self}: no row of {self.suite} has {self.column} = {self.value!r}; "
                f"values: {', '.join(sorted(set(cells)))}"
            )
        return keep


def hash_bucket(key: str) -> int:
    """Deterministic bucket 0-9 of ``key`` (an image path): ``sha256(key) mod 10``."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 10


def hash_unit(key: str) -> float:
    """A deterministic number in [0, 1) for ``key`` (an image path), independent of
    :func:`hash_bucket`'s split: the top 64 bits of ``sha256("image-share:" + key)``."""
    return int(hashlib.sha256(f"image-share:{key}".encode()).hexdigest()[:16], 16) / 2**64


COCO_FILE = re.compile(r"(?:^|/)(?:COCO_(?:train|val)2014_)?(\d{12})\.jpg$")  # 000000391895.jpg, COCO_val2014_000000391895.jpg


def coco_image_id(path: str) -> int | None:
    """The COCO image id a path names (COCO 2017's ``000000391895.jpg`` or 2014's
    ``COCO_val2014_000000391895.jpg``: one photograph under either release), else None."""
    m = COCO_FILE.search(str(path))
    return int(m.group(1)) if m else None


def coco_image_ids(manifest: pd.DataFrame, columns: tuple[str, ...]) -> set[int]:
    """The COCO image ids that the image ``columns`` of ``manifest`` show (str or list cells)."""
    return {
        i
        for col in columns
        if col in manifest
        for cell in manifest[col].dropna()
        for path in (cell if isinstance(cell, list | tuple | np.ndarray) else [cell])
        if (i := coco_image_id(path)) is not None
    }


def coco_overlap_mask(manifest: pd.DataFrame, held: set[int]) -> np.ndarray:
    """[n] bool: the rows of ``manifest`` whose ``image`` is a COCO photograph of ``held``
    (:func:`coco_image_ids` of other suites). COCO 2017's train2017 re-splits 2014's train
    and val, so ARO COCO-Order's Karpathy-test photographs are train2017 images under
    another file name."""
    return manifest["image"].map(lambda p: coco_image_id(p) in held).to_numpy(dtype=bool)


def image_share_mask(manifest: pd.DataFrame, share: float) -> np.ndarray:
    """[n] bool: the rows whose ``image`` hashes below ``share`` (:func:`hash_unit`).

    Every row of a kept image is kept, and an image is kept or dropped alike in every
    suite given the same share: ``coco-families`` cut to a share keeps, in its validation
    rows, exactly the rows of ``coco-families-dev`` cut to that share. The split (hash
    buckets) is independent of it, so each split keeps about ``share`` of its images.
    """
    if not 0 < share <= 1:
        raise ValueError(f"an image share must be in (0, 1], got {share}")
    if share == 1:
        return np.ones(len(manifest), dtype=bool)
    if "image" not in manifest:
        raise ValueError(f"an image share needs an `image` column; columns: {', '.join(map(str, manifest.columns))}")
    keep = {p: hash_unit(str(p)) < share for p in set(manifest["image"])}
    return manifest["image"].map(keep).to_numpy(dtype=bool)


SPLITS = ("train", "validation", "holdout")  # bucket_split's names, in bucket order


def bucket_split(bucket: int) -> str:
    """BindCLIP's split rule: buckets 0-2 ``train``, 3-4 ``validation``, 5-9 ``holdout``."""
    return "train" if bucket <= 2 else "validation" if bucket <= 4 else "holdout"
