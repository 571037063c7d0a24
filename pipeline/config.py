"""One dataclass per stage, loaded from a ``params.yaml`` section plus CLI overrides.

A stage is one word in four places: the ``dvc.yaml`` stage, the ``params.yaml`` section,
``stages/<word>.py`` and ``pipeline <word>``. Every artifact stores the resolved config
it was made from (``asdict(cfg)``).

Loading validates with pydantic in strict mode against the dataclasses' annotations, so
``batch_size: eight``, ``batch_size: 0``, ``skip_missing: 'no'`` (a string, not a YAML
boolean), ``suites: sugarcrepe`` (a string where a list is expected), an unknown key, a
section written as a list, malformed YAML, a key written twice in one mapping (YAML would
keep the last silently), a misspelled section name (which would otherwise run the defaults),
an infinite or NaN number where a finite one is needed and a missing ``--params`` file are
each refused with one line naming the file, the key, the value given and what is expected
(:class:`ParamsError`), before any stage runs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    with_config,
)

C = TypeVar("C")
STRICT = ConfigDict(strict=True, extra="forbid")  # no coercion ('no' -> True, 'abc' -> list), no unknown keys
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # a learning rate, a temperature
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # a weight decay, a penalty
BatchSize = Annotated[int, Field(gt=0, le=1 << 20)]  # items per batch: positive, and an array size numpy can hold
MAX_THREADS = max(8, 4 * (os.cpu_count() or 1))  # past the cores, more threads only queue (and 10**5 exhaust memory)
Threads = Annotated[int, Field(gt=0, le=MAX_THREADS)]  # torch intra-op threads


def _distinct(values: list) -> list:
    """A list of names or seeds run once each: an entry given twice would run (and count) twice."""
    twice = sorted({str(v) for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} more than once; give each once")
    return values


Names = Annotated[list[str], AfterValidator(_distinct)]  # suites, variants, encoders: each once
Seed = Annotated[int, Field(ge=0, lt=2**63)]  # what every generator here (numpy, torch) takes
Seeds = Annotated[list[Seed], AfterValidator(_distinct)]
# The sections a params file may have: one per stage and command (a misspelled one is refused).
SECTIONS = ("world", "toyclip", "extract", "manifests", "train", "ridge", "score", "report", "compare")


class ParamsError(ValueError):
    """A params file or override the stage configs refuse: one line naming the file, the key,
    the value and what is expected."""


class OptionsError(ParamsError, TypeError):
    """A scorer family's options (``train.<variant>.scorer`` / ``objective``,
    ``score.options``) that its schema refuses: an unknown key (a TypeError too, as a keyword
    its factory does not take) or a value of the wrong type."""


def family_options(cls: type[C], values: dict[str, Any], what: str, fixed: dict[str, Any] | None = None) -> C:
    """``cls(**values, **fixed)`` for a family's options dataclass, each value first checked
    strictly against its field (a YAML ``'no'`` is not a bool, ``'abc'`` not a number);
    ``fixed`` holds the fields its variant sets, which are not options; ``what`` names the
    options in the one-line :class:`OptionsError`."""
    fixed = fixed or {}
    names = sorted(f.name for f in fields(cls) if f.init and f.name not in fixed)
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise OptionsError(f"unknown {what} {unknown}; valid: {names}")
    values = {**values, **fixed}
    try:
        TypeAdapter(cls).validate_json(json.dumps(values, default=str), strict=True)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # the options' own check across fields (e.g. a weights key): no field to name
            raise OptionsError(f"{what}: {msg}") from None
        key = ".".join(map(str, err["loc"]))
        raise OptionsError(f"{what}: {key} = {err.get('input')!r}: {msg}") from None
    return cls(**values)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML itself keeps the
    last). Keys brought in by a merge (``<<: *anchor``) may be overridden, as YAML means."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is written twice (first at line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

SHAPES_SUITES = (
    "shapes-whatsup",
    "shapes-aro",
    "shapes-sugarcrepe",
    "shapes-retrieval",
    "shapes-multi",
    "shapes-train",
    "shapes-dev",
)


MAX_WORLD_IMAGE_SIZE = 1024  # the world's renderer workers hold whole images: 16x the toy's input side


@with_config(STRICT)
@dataclass
class WorldConfig:
    """The shapes world (``pipeline world``)."""

    seed: Seed = 0  # master seed; every scene is a pure function of (seed, index)
    image_size: Annotated[int, Field(ge=16, le=MAX_WORLD_IMAGE_SIZE)] = 64  # rendered image side in pixels (toy CLIP input resolution)
    out: str = "cache/world"  # output folder: images/ and manifests/
    n_whatsup: NonNegativeInt = 100  # object pairs; 4 images (left/right/above/below) each
    n_aro: NonNegativeInt = 200  # items per ARO-style category (relation, attribution, order)
    n_sugarcrepe: NonNegativeInt = 100  # items per SugarCrepe-style category (7 categories)
    n_retrieval_groups: NonNegativeInt = 40  # groups of compositional variants (5 scenes each)
    n_multi_groups: NonNegativeInt = 40  # shapes-multi galleries of near-duplicates (3-5 objects a scene)
    n_train: NonNegativeInt = 2400  # training pairs (shapes-train), spread over the 8 families
    n_dev: NonNegativeInt = 480  # development pairs (shapes-dev), spread over the 8 families
    suites: Names = field(default_factory=lambda: list(SHAPES_SUITES))  # suites to write


@with_config(STRICT)
@dataclass
class ToyClipConfig:
    """Training the toy CLIP on shapes-world scenes (``pipeline toyclip``)."""

    seed: Seed = 0  # seeds init, the training-scene pool and the batch order
    model: str = "toy-vit"  # open_clip config shipped in pipeline/encoders/configs/
    out: str = "cache/toyclip"  # checkpoint folder (model.safetensors, config.json, log)
    steps: NonNegativeInt = 1000  # optimisation steps (the first colourless_steps on the colourless pool: all of them when steps is smaller)
    batch_size: BatchSize = 128  # contrastive batch (in-batch negatives only)
    lr: PositiveFinite = 2e-3  # AdamW peak learning rate (cosine decay to 0, linear warm-up)
    warmup: NonNegativeInt = 100  # warm-up steps (a run shorter than its warm-up never reaches lr)
    weight_decay: NonNegativeFinite = 0.1  # AdamW weight decay (matrices only)
    pool_size: PositiveInt = 8000  # pre-rendered training scenes (train hash buckets only)
    colourless_steps: NonNegativeInt = 400  # first steps on the colourless pool (all objects white, shapes
    #   named bare: pipeline.world.colourless_training_batch), then the full mixture
    logit_scale_init: PositiveFinite = 14.3  # initial CLIP temperature exp(t) (CLIP: 1/0.07); learnt
    text_position_std: NonNegativeFinite = 0.002  # frozen text positional embedding N(0, std): 0 = exact
    #   bag of words (swap captions tie), 0.01 = open_clip's init (not frozen there)
    log_every: PositiveInt = 10  # steps between train_log.json entries
    checkpoint_every: PositiveInt = 200  # steps between resume.pt checkpoints
    threads: Threads = 2  # torch intra-op threads (at most MAX_THREADS: four per core, at least 8)

    def __post_init__(self) -> None:
        """Refuse a batch larger than the scene pool it is drawn from."""
        if self.batch_size > self.pool_size:
            raise ValueError(f"batch_size {self.batch_size} exceeds pool_size {self.pool_size}: each batch draws distinct scenes from the pool")


@with_config(STRICT)
@dataclass
class ExtractConfig:
    """Running a frozen encoder once over every image and caption (``pipeline extract``)."""

    model: str = "toy"  # encoder key: toy, ViT-L-14-336, ViT-B-32, ... (see `pipeline encoders`)
    pretrained: str = "openai"  # weights tag/path for real models; "none" = random init
    init_seed: Seed = 0  # seed of the random init (pretrained: none), recorded in the store fingerprint
    checkpoint: str = "cache/toyclip/model.safetensors"  # toy CLIP weights
    world: str = "cache/world"  # shapes world folder (manifests/ and images/ of shapes-* suites)
    suites: Names = field(default_factory=lambda: list(SHAPES_SUITES))  # suites to encode
    manifests: dict[str, str] = field(default_factory=dict)  # suite -> manifest path override
    image_roots: dict[str, str] = field(default_factory=dict)  # suite -> image root override
    out: str = "cache/features"  # store folder: <out>/<encoder>.zarr (or an fsspec URL: s3://, gs://, memory://, file://)
    storage_options: dict[str, Any] = field(default_factory=dict)  # fsspec options of a remote store (credentials, endpoint)
    batch_size: BatchSize = 64  # images/captions per forward pass
    threads: Threads = 2  # torch intra-op threads (at most MAX_THREADS: four per core, at least 8)
    device: str = "cpu"  # torch device
    skip_missing: bool = False  # score without items whose image is missing (counted, reported)
    skip_bad_images: bool = False  # score without items whose image is corrupt, undecodable or over the decompression-bomb limit (counted, reported)
    replace_mismatch: bool = False  # replace (not refuse) a store written by another encoder/schema
    object_crops: bool = False  # also re-encode every object_boxes crop (object/* arrays; the geometry rerankers' objects: crops)

    def __post_init__(self) -> None:
        """Refuse a suite name under ``manifests`` / ``image_roots`` that no suite has: a typo
        there would silently fall back to the default manifest or image folder."""
        from pipeline.benchmarks import SUITES

        known = set(SUITES.names())
        for key in ("manifests", "image_roots"):
            unknown = sorted(set(getattr(self, key)) - known)
            if unknown:
                raise ValueError(f"{key} names unknown suite(s) {', '.join(unknown)} (see `pipeline suites`)")
        if not self.out.strip():
            raise ValueError("out is empty: give the folder the store goes in (default cache/features) or a URL")


@with_config(STRICT)
@dataclass
class ScoreConfig:
    """Scoring suites from the cache (``pipeline score``)."""

    variants: Names = field(default_factory=lambda: ["clip"])  # scorer registry keys
    suites: Names = field(default_factory=lambda: list(SHAPES_SUITES[:4]))  # suites to score
    encoder: str = "toy"  # which store under extract.out
    batch_size: BatchSize = 256  # items per scoring batch
    seed_variants: Names = field(default_factory=list)  # trained variants also scored per training seed (<variant>@seed<k>)
    seed_suites: Names = field(default_factory=list)  # suites the per-seed runs score ([] = every entry of `suites`)
    checkpoints: str = "cache/checkpoints"  # trained scorers: <checkpoints>/<variant>/
    device: str = "cpu"  # torch device the scorers run on (features are read on the host, moved per batch)
    scores_out: str = "cache/scores"  # per-item scores: <scores_out>/<variant>/<suite>.parquet
    metrics_out: str = "reports/metrics"  # <metrics_out>/<variant>/<suite>.json
    replacements: Annotated[list[Literal["shuffle", "fixed", "true"]], AfterValidator(_distinct)] = field(default_factory=list)  # image replacements also scored on choice suites ("shuffle", "fixed", "true"): <variant>@<mode>
    replacement_variants: list[str] = field(default_factory=list)  # variants the replacements score ([] = every entry of `variants`)
    replacement_seed: Seed = 0  # seed of the shuffle permutation and of the fixed image
    options: dict[str, dict] = field(default_factory=dict)  # variant -> its factory's options (e.g. the rerankers' k, alpha, structure)

    @property
    def replaced(self) -> list[str]:
        """The variants the image replacements score (``replacement_variants``, else all)."""
        return list(self.replacement_variants or self.variants)


@with_config(STRICT)
@dataclass
class TrainConfig:
    """Training one scorer variant from the cache (``pipeline train --variant bindclip``).

    ``params.yaml`` has one ``train.<variant>`` section per trainable variant (listed in
    ``train.variants``); what is the family's own lives in ``scorer`` (its factory's
    options) and ``objective`` (its training hook's options), so the loop knows no family.
    """

    variant: str = "bindclip"  # trainable scorer registry key (the section's name)
    encoder: str = "toy"  # which store under extract.out to read
    train_suite: str = "shapes-train"  # training pairs (with cf/flip images and paraphrases); a suite or a selection of its rows: coco-families[train] (its `split` column), suite[column=value]
    dev_suite: str = "shapes-dev"  # checkpoint selection and the family's dev choices (never a test suite); e.g. coco-families[validation]
    train_items: PositiveInt | None = None  # train on a seeded sample of this many training items (None: all); bounds a large suite's memory
    dev_items: PositiveInt | None = None  # select on a seeded sample of this many dev items (None: all); bounds the time of each dev evaluation
    sample_seed: Seed = 0  # seed of both samples, the same for every training seed
    seeds: Seeds = field(default_factory=lambda: [0, 1, 2])  # one model per seed; the first is the one scored as `variant`
    steps: NonNegativeInt = 300  # optimisation steps (BindCLIP paper: 3 epochs x 100 steps)
    batch_size: BatchSize = 64  # items per step (BindCLIP paper: 64)
    lr: PositiveFinite = 1e-4  # AdamW peak learning rate on the scorer's parameters (BindCLIP paper: 1e-4)
    lr_schedule: Literal["constant", "cosine"] = "constant"  # "constant" (lr throughout) or "cosine": linear warm-up over `warmup` steps, cosine decay to 0 at `steps`
    warmup: NonNegativeInt = 0  # warm-up steps of the cosine schedule
    weight_decay: NonNegativeFinite = 1e-3  # AdamW weight decay (BindCLIP paper: 1e-3)
    eval_every: PositiveInt = 50  # dev evaluation / checkpoint-selection period in steps
    scorer: dict = field(default_factory=dict)  # kwargs of the scorer factory (e.g. BindClipConfig fields)
    objective: dict = field(default_factory=dict)  # options of the family's training hook (e.g. BindClipObjective fields)
    out: str = "cache/checkpoints"  # <out>/<variant>/model.safetensors (+ seed<k>/)
    threads: Threads = 2  # torch intra-op threads (at most MAX_THREADS: four per core, at least 8)
    device: str = "cpu"  # torch device of the scorer and of the training features (moved there once)

    def __post_init__(self) -> None:
        """Refuse a training or dev suite no suite has (the store's own message would advise
        extracting it), and a selection that is not one of the accepted forms."""
        for key in ("train_suite", "dev_suite"):
            _known_suite(getattr(self, key), key)


@with_config(STRICT)
@dataclass
class ManifestsConfig:
    """Real suites' manifests built from their official annotation files (``pipeline manifests``)."""

    roots: dict[str, str] = field(default_factory=dict)  # suite -> folder holding its official annotation files (see `pipeline suites`)
    out: str = "cache/manifests"  # <out>/<suite>.parquet (point extract.manifests.<suite> here)
    image_share: dict[str, Annotated[float, Field(gt=0, le=1)]] = field(default_factory=dict)  # suite -> keep the items of this share of its images, chosen by a hash of the image path (the same images in every suite: coco-families and coco-families-dev agree)
    disjoint_from: dict[str, list[str]] = field(default_factory=dict)  # suite -> suites whose COCO images it must not hold (a training suite's rows on a test suite's photographs are dropped, by COCO image id)


@with_config(STRICT)
@dataclass
class RidgeConfig:
    """Fitting ``ridge-fgw``'s phrase -> object map on the training split (``pipeline ridge``)."""

    encoder: str = "toy"  # which store under extract.out
    suite: str = "shapes-train"  # training pairs: every annotated object (object_names, object_boxes)
    lam: NonNegativeFinite = 1.0  # ridge penalty on the map (intercept unpenalised)
    shrinkage: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.1  # residual covariance shrunk this far toward its mean eigenvalue before whitening (1: plain centred cosine)
    ranks: Annotated[list[NonNegativeInt], Field(min_length=1)] = field(default_factory=lambda: [2, 4, 8, 16, 32, 64, 0])  # candidate widths of the compared space (the map's top directions; 0: all), chosen with the grid on held-out training images
    inverted_softmax: Annotated[list[NonNegativeFinite], Field(min_length=1)] = field(default_factory=lambda: [0.0, 3.0, 10.0, 30.0, 100.0, 300.0])  # candidate inverse temperatures of the hub offset (0: none), chosen with the grid and rank on held-out training images
    objects: Literal["box-mean", "crops"] = "box-mean"  # object embeddings the map targets: box-mean (grid chosen on held-out images) or crops (extract.object_crops)
    out: str = "cache/checkpoints"  # <out>/ridge-fgw/{model.safetensors, config.json}

    def __post_init__(self) -> None:
        """Refuse a suite no suite has, and a selection (``suite[column=value]``): the map is
        fitted on a whole training suite."""
        if _known_suite(self.suite, "suite") != self.suite:
            raise ValueError(f"suite takes a whole suite's name, not a selection of its rows, got {self.suite!r}")


@with_config(STRICT)
@dataclass
class CompareConfig:
    """The same scorer variants on several encoders (``pipeline compare-encoders``).

    Each encoder gets its own feature store, checkpoints and scores under ``<out>/<encoder>/``
    (``features/<encoder>.zarr``, never inside ``extract.out``), and metrics under
    ``<metrics_out>/<encoder>/``;
    the other sections of ``params.yaml`` (``extract``, ``train.<variant>``, ``score``,
    ``toyclip``) supply every setting not named here, so the encoders differ in nothing else.
    """

    encoders: Names = field(default_factory=lambda: ["toy", "toy-small"])  # encoder keys
    variants: Names = field(default_factory=lambda: ["clip", "bindclip", "global-m", "flowclip", "flowclip-cimr"])  # scored on every encoder (trainable ones trained first)
    suites: Names = field(default_factory=lambda: list(SHAPES_SUITES[:4]))  # suites scored
    seeds: Seeds = field(default_factory=lambda: [0])  # training seeds per trainable variant
    reuse_pipeline: bool = True  # the pipeline's own encoder (extract.model) reads `dvc repro`'s scores instead of retraining
    pretrained: dict[str, str] = field(default_factory=dict)  # encoder -> weights for non-toy encoders ("none" = random init)
    toyclip: dict = field(default_factory=dict)  # overrides of the toyclip section for training a toy encoder's weights
    out: str = "cache/encoders"  # <out>/<encoder>/{toyclip,checkpoints,scores}
    metrics_out: str = "reports/encoders"  # <metrics_out>/<encoder>/<variant>/<suite>.json, summary.json
    bootstrap: PositiveInt = 10000  # resamples of the means' CIs
    seed: Seed = 0  # bootstrap seed


@with_config(STRICT)
@dataclass
class ReportConfig:
    """The human report (``pipeline report``)."""

    out: str = "reports"  # report.md, figures/, plots/
    bootstrap: PositiveInt = 10000  # paired-bootstrap resamples for CIs
    seed: Seed = 0  # bootstrap seed
    examples: NonNegativeInt = 4  # example images per suite
    head_to_head: list[str] = field(default_factory=lambda: ["clip", "bindclip", "global-m", "flowclip", "flowclip-cimr"])  # the cross-family table's variants (those scored)
    encoders: str = "reports/encoders/summary.json"  # `pipeline compare-encoders`' summary, shown when present

    def __post_init__(self) -> None:
        if not self.out.strip():  # "" would write report.md, figures/ and plots/ into the working folder
            raise ValueError("out is empty: give the folder the report goes in (default reports)")


def _known_suite(text: str, key: str) -> str:
    """The registered suite ``text`` names (a plain name or a selection of its rows), else a
    ValueError naming ``key`` and where the valid names are listed."""
    from pipeline.benchmarks import SUITES
    from pipeline.benchmarks.base import SuiteSelection

    suite = SuiteSelection.parse(text).suite
    if suite not in SUITES.names():
        raise ValueError(f"{key} names unknown suite {suite!r} (see `pipeline suites`)")
    return suite


def load_config(cls: type[C], params: str | Path | None, section: str, overrides: dict[str, Any] | None = None) -> C:
    """Build ``cls`` from ``params[section]`` and the non-None overrides, validated.

    ``params=None`` means no file (every default); a named file must exist. Raises
    :class:`ParamsError` (one line) on anything the schema refuses.
    """
    values = dict(_section(params, section))
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    cfg = _build(cls, values, section, params)  # the file's values, blamed on the file
    cfg = _build(cls, {**values, **given}, section) if given else cfg
    out = getattr(cfg, "out", None) if section == "extract" else None
    if isinstance(out, str) and out.startswith("memory://"):  # the library's in-process stores (tests)
        where = "the command line" if "out" in given else (params or "the defaults")
        raise ParamsError(
            f"{where}: extract.out = {out!r}: a memory:// store lives inside one process and is gone when "
            "the command ends; give a folder or a shared URL (file://, s3://, gs://)"
        )
    return cfg


def read_params(params: str | Path | None) -> dict[str, Any]:
    """The whole params file as a mapping (``{}`` for ``None`` or an empty file).

    A missing file, malformed YAML and a top level that is not a mapping raise
    :class:`ParamsError` naming the file (and the line of a YAML error)."""
    if params is None:
        return {}
    path = Path(params)
    if path.is_dir():
        raise ParamsError(f"{path}: a folder, not a params file (pass the YAML file itself, e.g. {path / 'params.yaml'})")
    if not path.is_file():
        raise ParamsError(f"{path}: no such params file (pass an existing --params, or run where params.yaml is)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError as e:
        raise ParamsError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ParamsError(f"{path}: malformed YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of sections (world:, extract:, ...), got a {type(data).__name__}")
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ParamsError(f"{path}: unknown section {', '.join(map(str, unknown))} (valid: {', '.join(SECTIONS)})")
    return data


def _section(params: str | Path | None, section: str) -> dict[str, Any]:
    """``params[section]`` (dotted for nested sections: ``train.bindclip``); ``{}`` when absent."""
    value: Any = read_params(params)
    for part in section.split("."):
        if isinstance(value, dict) and part in value and value[part] is None:  # `extract:` with nothing under it
            raise ParamsError(
                f"{params}: section `{section}` is empty (null); give its keys, or delete the line to run its defaults"
            )
        value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return {}
    if not isinstance(value, dict):
        raise ParamsError(f"{params}: section `{section}` must be a mapping of key: value, got a {type(value).__name__} ({_show(value)})")
    return value


def _build(cls: type[C], values: dict[str, Any], section: str, params: str | Path | None = None) -> C:
    """``cls(**values)`` validated by pydantic (strict, no unknown keys); its errors become
    one :class:`ParamsError` line.

    The values go through pydantic's JSON mode, the one where strict mode takes a mapping for
    a dataclass (YAML's scalars are JSON's; a YAML date is passed on as its text)."""
    try:
        return TypeAdapter(cls).validate_json(json.dumps(values, default=str))
    except ValidationError as e:
        where = str(params) if params is not None else "the command line"
        raise ParamsError(f"{where}: " + "; ".join(_describe(err, cls, section) for err in e.errors())) from None


def _describe(err: dict[str, Any], cls: type, section: str) -> str:
    """One pydantic error as ``section.key = value: expected ...``."""
    key = ".".join([section, *(str(p) for p in err["loc"])])
    if err["type"] == "value_error":  # a check of the config's own (__post_init__): its message
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"] and msg.split(" ", 1)[0] in cls.__dataclass_fields__:  # it names its key: section.key ...
            return f"{key}.{msg}"
        return f"{key}: {msg}"
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        valid = ", ".join(f.name for f in cls.__dataclass_fields__.values())
        return f"unknown key {key} (valid: {valid})"
    return f"{key} = {_show(err['input'])}: expected {_expected(err)}{_number_hint(err)}"


def _number_hint(err: dict[str, Any]) -> str:
    """For a number YAML 1.1 read as text (``1e-3``, ``1.0e4``: PyYAML reads an exponent only
    after a dot and with its sign), the form it reads: the integer for an integer key
    (``1e4`` -> ``10000``), else a dot and a signed exponent (``1e4`` -> ``1.0e+4``)."""
    text = err["input"].strip() if isinstance(err["input"], str) else ""
    if not re.fullmatch(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+", text):
        return ""
    if err["type"].startswith("int"):
        return f" (YAML reads {text} as text: write the integer, {int(float(text))})" if float(text).is_integer() else ""
    mantissa, exponent = re.split(r"[eE]", text, maxsplit=1)
    mantissa, exponent = mantissa if "." in mantissa else f"{mantissa}.0", exponent if exponent[0] in "+-" else f"+{exponent}"
    return f" (YAML reads {text} as text: write it with a dot and a signed exponent, e.g. {mantissa}e{exponent})"


def _expected(err: dict[str, Any]) -> str:
    """pydantic's message turned into what the key expects."""
    msg = err["msg"]
    for prefix in ("Input should be ", "Value should be ", "Input must be "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg[0].lower() + msg[1:]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def train_variants(params: str | Path | None) -> list[str]:
    """The trainable variants ``params.yaml`` lists under ``train.variants``."""
    listed = _section(params, "train").get("variants") or []
    if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
        raise ParamsError(f"{params}: train.variants = {_show(listed)}: expected a list of variant names")
    return list(listed)


def load_train_config(params: str | Path | None, variant: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """``TrainConfig`` of ``variant`` from ``params["train"][variant]`` plus overrides."""
    train = _section(params, "train")
    if params is not None and variant not in train:
        listed = ", ".join(k for k in train if k != "variants") or "none"
        raise ParamsError(f"{params} has no train.{variant} section; trainable sections: {listed}")
    values = {**_section(params, f"train.{variant}"), "variant": variant}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    cfg = _build(TrainConfig, values, f"train.{variant}", params)
    return _build(TrainConfig, {**values, **given}, f"train.{variant}") if given else cfg
