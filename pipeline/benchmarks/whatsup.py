"""What'sUp (Kamath, Hessel, Chang, EMNLP 2023): loaders and official metrics.

Official files (github.com/amitakamath/whatsup_vlms; gdown downloads listed in its
``dataset_zoo/aro_datasets.py``), all under one ``root`` (the official ``data/`` folder):

* ``whatsup-a``: ``controlled_images_dataset.json``; ``whatsup-b``: ``controlled_clevr_dataset.json``.
  A list of ``{"image_path", "caption_options": [4 str]}``; option 0 is correct.
  ``image_path`` is stored verbatim (e.g. ``data/controlled_images/mug_left_of_plate.jpeg``):
  the official loader opens it relative to the *working directory*, so the image root for
  these suites is the folder that contains ``data/`` (the parent of ``root``).
* ``whatsup-coco``: ``coco_qa_one_obj.json`` + ``coco_qa_two_obj.json``, lists of
  ``[image_id, correct, wrong]``; image ``val2017/{image_id:012d}.jpg`` relative to ``root``.
* ``whatsup-vg``: ``vg_qa_one_obj.json`` + ``vg_qa_two_obj.json``, same format; image
  ``vg_images/{image_id}.jpg`` relative to ``root``.

Official metrics (``evaluate_scores``), with ``np.argmax`` (the first maximum wins, so a tie
counts as right since option 0 is correct):

* individual: mean over items of ``[argmax == 0]``;
* pair (Controlled only): items are grouped by file name, ``key = (fn.split('_')[0],
  fn.split('_')[-1][:-5])`` and ``arrangement = fn.split('_')[1]``; a pair is the two
  opposite arrangements of one key along one axis (left/right, and on/under in A or
  in-front/behind in B); ``pair = pair_correct / (N/2)``;
* set: all four arrangements of a key correct, ``set = set_correct / (N/4)``.

Our pair/set units are one per (key, axis) and one per key; a missing arrangement counts as
wrong, as in the official ``eval_dict`` defaults. On complete data (every key has its four
arrangements, as in the official files) the unit counts are exactly N/2 and N/4; on a subset
they are 2 and 1 per key present, which we warn about.
``whatsup-coco`` / ``whatsup-vg`` report ``one-obj``, ``two-obj`` and ``individual`` = the
unweighted mean of the two subset accuracies (the paper's Table 1).

Pooled pair criterion (BindCLIP; benchmarks.md §3.3): the pairs of Controlled A and B
(:data:`POOLED_SUITES`, 206 + 204 = 410 on the official files) scored as one set,
``(pair_correct_A + pair_correct_B) / (N_A/2 + N_B/2)``, which weights the subsets by their
pair counts where ``mean(pair_A, pair_B)`` would weight them 1/2 each. It spans two suites,
so it is not a suite metric: :func:`pooled_pair_metrics` computes it from each suite's
``(manifest, scores)`` and :func:`pooled_pairs` gives its units, which the report tests
against frozen CLIP with the exact McNemar test
(:func:`pipeline.report.compare.pair_mcnemar`; the seed's 4 -> 17 of 410, p = 0.002).

These metric functions are shared with ``shapes-whatsup`` (arrangements left/right/above/below).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import SUITES, Suite, Units, choice_correct
from pipeline.benchmarks.intake import (
    OFFICIAL,
    read_json_list,
    relative_image_path,
    require_file,
    shown,
    string_list_field,
    text_field,
)

SOURCE = "download it with gdown as listed in dataset_zoo/aro_datasets.py of github.com/amitakamath/whatsup_vlms"
# The opposite-arrangement axes; a suite uses the horizontal axis and whichever other axis
# its arrangements name (A: on/under, B: in-front/behind, shapes world: above/below).
AXES = (("left", "right"), ("on", "under"), ("in-front", "behind"), ("above", "below"))
ARRANGEMENTS = tuple(a for axis in AXES for a in axis)
CONTROLLED_METRICS = ("individual", "pair", "set")
POOLED_SUITES = ("whatsup-a", "whatsup-b")  # the suites whose pairs the 410-pair criterion pools
QA_METRICS = ("individual", "one-obj", "two-obj")
QA_CATEGORIES = ("one-obj", "two-obj")  # the subsets `individual` macro-averages over
# the official per-preposition labels each Controlled subset's file names give (read_controlled)
CONTROLLED_CATEGORIES = {
    "a": ("left_of", "right_of", "on", "under"),
    "b": ("left_of", "right_of", "in-front_of", "behind"),
}
CONTROLLED_AXES = {"a": (AXES[0], AXES[1]), "b": (AXES[0], AXES[2])}  # each subset's two axes


# ---------------------------------------------------------------------------- Controlled


def parse_controlled_name(image_path: str) -> tuple[str, str]:
    """``(pair_key, arrangement)`` from an official file name, as the official code does:
    ``obj = fn.split('_')[0]``, ``ref = fn.split('_')[-1][:-5]``, ``arrangement = fn.split('_')[1]``.
    The key is ``"obj|ref"``; ``ref`` drops the file's suffix whatever its length (the official
    ``[:-5]`` drops ``.jpeg``, the official files' suffix, and would cut a ``.png`` name's last
    letter)."""
    fn = image_path.split("/")[-1]
    parts = fn.split("_")
    if len(parts) < 3 or not parts[1]:
        raise ValueError(f"What'sUp file name {fn!r} is not <obj>_<arrangement>_<ref>.jpeg")
    return f"{parts[0]}|{parts[-1].rsplit('.', 1)[0]}", parts[1]


N_CONTROLLED_OPTIONS = 4  # the official Controlled files give every image four caption options


def read_controlled(path: Path, subset: str) -> pd.DataFrame:
    """One Controlled file -> manifest rows; ``subset`` is ``a`` or ``b``.

    Raises:
        ValueError: naming ``path`` and the entry: not a JSON list or an empty one, an entry
            whose ``image_path`` is not a non-empty string, whose ``caption_options`` is not
            a list of :data:`N_CONTROLLED_OPTIONS` non-empty strings (a string would be split
            into its characters), whose file name has no known arrangement, or an entry
            naming the same image as an earlier one (it would count twice in individual
            accuracy and overwrite the other in its pair and set).
    """
    data = read_json_list(path, source=SOURCE)
    rows = []
    first_of: dict[str, int] = {}  # image path -> index of the entry that names it first
    for i, d in enumerate(data):
        item, where = f"{subset}/{i}", f"entry {i}"
        image = relative_image_path(text_field(d, "image_path", path, where), item)
        options = string_list_field(d, "caption_options", path, where, length=N_CONTROLLED_OPTIONS)
        if image in first_of:
            j = first_of[image]
            same = "a copy of" if data[j] == d else "another entry for the image of"
            raise ValueError(
                f"{path}: entry {i} is {same} entry {j} ({image!r}); each image is one item, and a "
                f"repeated one would count twice: remove entry {i}, or replace the file with the official one"
            )
        first_of[image] = i
        try:
            key, arrangement = parse_controlled_name(image)
        except ValueError as e:
            raise ValueError(f"{path}: {where} (item {item}): {e}; replace the file with the official one") from None
        allowed = tuple(a for axis in CONTROLLED_AXES[subset] for a in axis)
        if arrangement not in allowed:
            raise ValueError(
                f"{path}: {where} (item {item}): arrangement {arrangement!r} of {image!r} is not one of "
                f"Controlled {subset.upper()}'s {allowed}; replace the file with the official one"
            )
        fn = image.split("/")[-1]
        rows.append(
            {
                "item_id": item,
                "image": image,
                "captions": list(options),
                "correct": 0,
                # the official per-preposition label: left_of, right_of, on, under, in-front_of, behind
                "category": fn.split("_")[1] + ("_of" if fn.split("_")[2] == "of" else ""),
                "pair_key": key,
                "arrangement": arrangement,
            }
        )
    return pd.DataFrame(rows)


def _controlled_suite(subset: str, file: str):
    def build_manifest(root: Path) -> pd.DataFrame:
        return read_controlled(require_file(root, file, SOURCE), subset)

    return build_manifest


def whatsup_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """Official individual / pair / set units (argmax-first ties, correct option 0)."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first")
    arr = manifest["arrangement"].to_numpy()
    unknown = sorted(set(arr) - set(ARRANGEMENTS))
    if unknown:
        raise ValueError(f"unknown arrangements {unknown}; valid: {ARRANGEMENTS}")
    # a pair is one axis of a key, a set both axes: Controlled A's and B's from their subset
    # (item ids "a/<i>", "b/<i>"), so a pair or set with some of its images skipped at extract
    # counts as wrong, as a missing arrangement does in the official eval_dict (a key whose
    # images were all skipped leaves no row: the score stage reports the items it leaves
    # out); other suites' axes from the arrangements
    subsets = {str(i).split("/")[0] for i in manifest["item_id"]}
    if len(subsets) == 1 and (subset := subsets.pop()) in CONTROLLED_AXES:
        axes = list(CONTROLLED_AXES[subset])
    else:
        axes = [AXES[0], *(ax for ax in AXES[1:] if set(ax) & set(arr))]
    others = axes[1:]
    # C[key][arrangement] = correct, missing arrangements count as wrong (official eval_dict)
    table: dict[str, dict[str, bool]] = {}
    for key, a, c in zip(manifest["pair_key"], arr, correct, strict=True):
        table.setdefault(key, {})[a] = bool(c)
    pairs = [table[k].get(x, False) and table[k].get(y, False) for k in table for x, y in axes]
    sets = [bool(others) and all(table[k].get(a, False) for ax in axes for a in ax) for k in table]
    set_size = 2 * max(len(axes), 2)
    if len(manifest) != set_size * len(table):
        incomplete = sum(len(v) != set_size for v in table.values())
        warnings.warn(
            f"What'sUp: {len(manifest)} items over {len(table)} keys, {incomplete} of them not a complete set of "
            f"{set_size}; pair/set are over the {len(pairs)} pairs / {len(sets)} sets present "
            "(the official N/2, N/4 denominators apply to complete data only)",
            stacklevel=2,
        )
    return {
        "individual": Units(correct.astype(float)),
        "pair": Units(np.array(pairs, dtype=float)),
        "set": Units(np.array(sets, dtype=float)),
    }


def pooled_pair_units(*units: dict[str, Units] | Units) -> Units:
    """Pair units of several suites pooled, in argument order (each a :func:`whatsup_units`
    output or its ``pair`` Units): ``(pair_correct_A + pair_correct_B) / (N_A/2 + N_B/2)``."""
    pairs = [u["pair"] if isinstance(u, dict) else u for u in units]
    return Units(np.concatenate([p.values for p in pairs]))


Scored = tuple[pd.DataFrame, np.ndarray]  # one suite's manifest and its [n, 4] option scores


def pooled_pairs(scored: Sequence[Scored]) -> Units:
    """The pooled pair units of each suite's ``(manifest, scores)``, suites in order."""
    if not scored:
        raise ValueError(
            f"the pooled pair criterion needs at least one suite's scores ({', '.join(POOLED_SUITES)})"
        )
    return pooled_pair_units(*(whatsup_units(m, s) for m, s in scored))


def pooled_pair_metrics(scored: Sequence[Scored]) -> dict[str, float]:
    """``pooled-pair`` (the pooled pair accuracy), ``pairs`` and ``pair-correct`` over the
    suites' ``(manifest, scores)`` (:data:`POOLED_SUITES` for the 410-pair criterion)."""
    pairs = pooled_pairs(scored).values
    return {
        "pooled-pair": float(pairs.mean()),
        "pairs": len(pairs),
        "pair-correct": int(pairs.sum()),
    }


# ---------------------------------------------------------------------------- COCO / VG QA


def qa_label(correct_caption: str, subset: str, dataset: str) -> str:
    """The official per-preposition label (diagnostic only)."""
    if subset == "one":
        return correct_caption.split()[-1]
    rules = {
        "coco": (("left of", "left"), ("right of", "right"), ("above", "above")),
        "vg": (
            ("left of", "left"),
            ("right of", "right"),
            ("front of", "front"),
            ("behind", "behind"),
        ),
    }[dataset]
    fallback = {"coco": "below", "vg": "top"}[dataset]
    return next((lab for pat, lab in rules if pat in correct_caption), fallback)


def read_qa(path: Path, subset: str, dataset: str) -> pd.DataFrame:
    """One QA file (``[image_id, correct, wrong]`` entries; values after the third are
    ignored, as the official loader ignores them) -> manifest rows."""
    data = read_json_list(path, length=3, source=SOURCE)
    rows = []
    for i, (image_id, good, bad) in enumerate(d[:3] for d in data):
        item = f"{subset}-obj/{i}"
        for place, caption in (("second (the correct caption)", good), ("third (the wrong caption)", bad)):
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"{path}: entry {i}: its {place} value is {shown(caption)}; expected a non-empty string; {OFFICIAL}")
        if not (isinstance(image_id, int) and not isinstance(image_id, bool) and image_id >= 0 or isinstance(image_id, str) and image_id.isdigit()):
            raise ValueError(f"{path}: entry {i}: its first value (the image id) is {shown(image_id)}; expected a non-negative integer id; {OFFICIAL}")
        image = (
            f"val2017/{str(image_id).zfill(12)}.jpg"
            if dataset == "coco"
            else f"vg_images/{image_id}.jpg"
        )
        rows.append(
            {
                "item_id": item,
                "image": relative_image_path(image, item),
                "captions": [good, bad],
                "correct": 0,
                "category": f"{subset}-obj",
                "preposition": qa_label(good, subset, dataset),
            }
        )
    return pd.DataFrame(rows)


def _qa_suite(dataset: str):
    def build_manifest(root: Path) -> pd.DataFrame:
        parts = [
            read_qa(require_file(root, f"{dataset}_qa_{s}_obj.json", SOURCE), s, dataset)
            for s in ("one", "two")
        ]
        return pd.concat(parts, ignore_index=True)

    return build_manifest


def qa_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """``one-obj``, ``two-obj`` accuracy (argmax-first) and ``individual`` = their mean."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    cat = manifest["category"].to_numpy()
    units = {c: Units(correct[cat == c]) for c in QA_CATEGORIES if (cat == c).any()}
    units["individual"] = Units(correct, groups=cat)  # macro over the two subsets
    return units


# ---------------------------------------------------------------------------- registration

for _subset, _file in (
    ("a", "controlled_images_dataset.json"),
    ("b", "controlled_clevr_dataset.json"),
):
    SUITES.register(
        f"whatsup-{_subset}",
        Suite(
            name=f"whatsup-{_subset}",
            task="choice",
            build_manifest=_controlled_suite(_subset, _file),
            units=whatsup_units,
            metric_names=CONTROLLED_METRICS,
            headline="pair",
            categories=CONTROLLED_CATEGORIES[_subset],
            description=(
                f"What'sUp Controlled {_subset.upper()}: root holds {_file}; image paths are the "
                "official data/... paths, so the image root is the folder containing data/"
            ),
        ),
    )

for _dataset, _images in (("coco", "val2017/"), ("vg", "vg_images/")):
    SUITES.register(
        f"whatsup-{_dataset}",
        Suite(
            name=f"whatsup-{_dataset}",
            task="choice",
            build_manifest=_qa_suite(_dataset),
            units=qa_units,
            metric_names=QA_METRICS,
            headline="individual",
            categories=QA_CATEGORIES,
            description=(
                f"What'sUp {'COCO' if _dataset == 'coco' else 'GQA'}-spatial: root holds "
                f"{_dataset}_qa_one_obj.json and {_dataset}_qa_two_obj.json; images under root/{_images}"
            ),
        ),
    )
