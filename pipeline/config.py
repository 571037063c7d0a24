"""One dataclass per stage, loaded from a ``params.yaml`` section plus CLI overrides.

A stage is one word in four places: the ``dvc.yaml`` stage, the ``params.yaml`` section,
``stages/<word>.py`` and ``pipeline <word>``. Every artifact stores the resolved config
it was made from (``asdict(cfg)``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

C = TypeVar("C")

SHAPES_SUITES = (
    "shapes-whatsup",
    "shapes-aro",
    "shapes-sugarcrepe",
    "shapes-retrieval",
    "shapes-multi",
    "shapes-train",
    "shapes-dev",
)


@dataclass
class WorldConfig:
    """The shapes world (``pipeline world``)."""

    seed: int = 0  # master seed; every scene is a pure function of (seed, index)
    image_size: int = 64  # rendered image side in pixels (toy CLIP input resolution)
    out: str = "cache/world"  # output folder: images/ and manifests/
    n_whatsup: int = 100  # object pairs; 4 images (left/right/above/below) each
    n_aro: int = 200  # items per ARO-style category (relation, attribution, order)
    n_sugarcrepe: int = 100  # items per SugarCrepe-style category (7 categories)
    n_retrieval_groups: int = 40  # groups of compositional variants (5 scenes each)
    n_multi_groups: int = 40  # shapes-multi galleries of near-duplicates (3-5 objects a scene)
    n_train: int = 2400  # training pairs (shapes-train), spread over the 8 families
    n_dev: int = 480  # development pairs (shapes-dev), spread over the 8 families
    suites: list[str] = field(default_factory=lambda: list(SHAPES_SUITES))  # suites to write


@dataclass
class ToyClipConfig:
    """Training the toy CLIP on shapes-world scenes (``pipeline toyclip``)."""

    seed: int = 0  # seeds init, the training-scene pool and the batch order
    model: str = "toy-vit"  # open_clip config shipped in pipeline/encoders/configs/
    out: str = "cache/toyclip"  # checkpoint folder (model.safetensors, config.json, log)
    steps: int = 1000  # optimisation steps (the first colourless_steps on the colourless pool)
    batch_size: int = 128  # contrastive batch (in-batch negatives only)
    lr: float = 2e-3  # AdamW peak learning rate (cosine decay to 0, linear warm-up)
    warmup: int = 100  # warm-up steps
    weight_decay: float = 0.1  # AdamW weight decay (matrices only)
    pool_size: int = 8000  # pre-rendered training scenes (train hash buckets only)
    colourless_steps: int = 400  # first steps on the colourless pool (all objects white, shapes
    #   named bare: pipeline.world.colourless_training_batch), then the full mixture
    logit_scale_init: float = 14.3  # initial CLIP temperature exp(t) (CLIP: 1/0.07); learnt
    text_position_std: float = 0.002  # frozen text positional embedding N(0, std): 0 = exact
    #   bag of words (swap captions tie), 0.01 = open_clip's init (not frozen there)
    train_token_embedding: bool = False  # False: 49k-row token embedding frozen at its init;
    #   True: trained with SparseAdam on the rows each batch uses
    log_every: int = 10  # steps between train_log.json entries
    checkpoint_every: int = 200  # steps between resume.pt checkpoints
    threads: int = 2  # torch intra-op threads


@dataclass
class ExtractConfig:
    """Running a frozen encoder once over every image and caption (``pipeline extract``)."""

    model: str = "toy"  # encoder key: toy, ViT-L-14-336, ViT-B-32, ... (see `pipeline encoders`)
    pretrained: str = "openai"  # weights tag/path for real models; "none" = random init
    init_seed: int = 0  # seed of the random init (pretrained: none), recorded in the store fingerprint
    checkpoint: str = "cache/toyclip/model.safetensors"  # toy CLIP weights
    world: str = "cache/world"  # shapes world folder (manifests/ and images/ of shapes-* suites)
    suites: list[str] = field(default_factory=lambda: list(SHAPES_SUITES))  # suites to encode
    manifests: dict[str, str] = field(default_factory=dict)  # suite -> manifest path override
    image_roots: dict[str, str] = field(default_factory=dict)  # suite -> image root override
    out: str = "cache/features"  # store folder: <out>/<encoder>.zarr
    batch_size: int = 64  # images/captions per forward pass
    threads: int = 2  # torch intra-op threads
    device: str = "cpu"  # torch device
    skip_missing: bool = False  # score without items whose image is missing (counted, reported)
    replace_mismatch: bool = False  # replace (not refuse) a store written by another encoder/schema
    object_crops: bool = False  # also re-encode every object_boxes crop (object/* arrays; the geometry rerankers' objects: crops)


@dataclass
class ScoreConfig:
    """Scoring suites from the cache (``pipeline score``)."""

    variants: list[str] = field(default_factory=lambda: ["clip"])  # scorer registry keys
    suites: list[str] = field(default_factory=lambda: list(SHAPES_SUITES[:4]))  # suites to score
    encoder: str = "toy"  # which store under extract.out
    batch_size: int = 256  # items per scoring batch
    seed_variants: list[str] = field(default_factory=list)  # trained variants also scored per training seed (<variant>@seed<k>)
    seed_suites: list[str] = field(default_factory=list)  # suites the per-seed runs score ([] = every entry of `suites`)
    checkpoints: str = "cache/checkpoints"  # trained scorers: <checkpoints>/<variant>/
    device: str = "cpu"  # torch device the scorers run on (features are read on the host, moved per batch)
    scores_out: str = "cache/scores"  # per-item scores: <scores_out>/<variant>/<suite>.parquet
    metrics_out: str = "reports/metrics"  # <metrics_out>/<variant>/<suite>.json
    replacements: list[str] = field(default_factory=list)  # image replacements also scored on choice suites ("shuffle", "fixed", "true"): <variant>@<mode>
    replacement_variants: list[str] = field(default_factory=list)  # variants the replacements score ([] = every entry of `variants`)
    replacement_seed: int = 0  # seed of the shuffle permutation and of the fixed image
    options: dict[str, dict] = field(default_factory=dict)  # variant -> its factory's options (e.g. the rerankers' k, alpha, structure)

    @property
    def replaced(self) -> list[str]:
        """The variants the image replacements score (``replacement_variants``, else all)."""
        return list(self.replacement_variants or self.variants)


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
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # one model per seed; the first is the one scored as `variant`
    steps: int = 300  # optimisation steps (BindCLIP paper: 3 epochs x 100 steps)
    batch_size: int = 64  # items per step (BindCLIP paper: 64)
    lr: float = 1e-4  # AdamW peak learning rate on the scorer's parameters (BindCLIP paper: 1e-4)
    lr_schedule: str = "constant"  # "constant" (lr throughout) or "cosine": linear warm-up over `warmup` steps, cosine decay to 0 at `steps`
    warmup: int = 0  # warm-up steps of the cosine schedule
    weight_decay: float = 1e-3  # AdamW weight decay (BindCLIP paper: 1e-3)
    eval_every: int = 50  # dev evaluation / checkpoint-selection period in steps
    scorer: dict = field(default_factory=dict)  # kwargs of the scorer factory (e.g. BindClipConfig fields)
    objective: dict = field(default_factory=dict)  # options of the family's training hook (e.g. BindClipObjective fields)
    out: str = "cache/checkpoints"  # <out>/<variant>/model.safetensors (+ seed<k>/)
    threads: int = 2  # torch intra-op threads
    device: str = "cpu"  # torch device of the scorer and of the training features (moved there once)


@dataclass
class ManifestsConfig:
    """Real suites' manifests built from their official annotation files (``pipeline manifests``)."""

    roots: dict[str, str] = field(default_factory=dict)  # suite -> folder holding its official annotation files (see `pipeline suites`)
    out: str = "cache/manifests"  # <out>/<suite>.parquet (point extract.manifests.<suite> here)


@dataclass
class RidgeConfig:
    """Fitting ``ridge-fgw``'s phrase -> object map on the training split (``pipeline ridge``)."""

    encoder: str = "toy"  # which store under extract.out
    suite: str = "shapes-train"  # training pairs: every annotated object (object_names, object_boxes)
    lam: float = 1.0  # ridge penalty on the map (intercept unpenalised)
    objects: str = "box-mean"  # object embeddings the map targets: box-mean (grid chosen on held-out images) or crops (extract.object_crops)
    out: str = "cache/checkpoints"  # <out>/ridge-fgw/{model.safetensors, config.json}


@dataclass
class CompareConfig:
    """The same scorer variants on several encoders (``pipeline compare-encoders``).

    Each encoder gets its own feature store, checkpoints and scores under ``<out>/<encoder>/``
    (``features/<encoder>.zarr``, never inside ``extract.out``), and metrics under
    ``<metrics_out>/<encoder>/``;
    the other sections of ``params.yaml`` (``extract``, ``train.<variant>``, ``score``,
    ``toyclip``) supply every setting not named here, so the encoders differ in nothing else.
    """

    encoders: list[str] = field(default_factory=lambda: ["toy", "toy-small"])  # encoder keys
    variants: list[str] = field(default_factory=lambda: ["clip", "bindclip", "global-m", "flowclip", "flowclip-cimr"])  # scored on every encoder (trainable ones trained first)
    suites: list[str] = field(default_factory=lambda: list(SHAPES_SUITES[:4]))  # suites scored
    seeds: list[int] = field(default_factory=lambda: [0])  # training seeds per trainable variant
    reuse_pipeline: bool = True  # the pipeline's own encoder (extract.model) reads `dvc repro`'s scores instead of retraining
    pretrained: dict[str, str] = field(default_factory=dict)  # encoder -> weights for non-toy encoders ("none" = random init)
    toyclip: dict = field(default_factory=dict)  # overrides of the toyclip section for training a toy encoder's weights
    out: str = "cache/encoders"  # <out>/<encoder>/{toyclip,checkpoints,scores}
    metrics_out: str = "reports/encoders"  # <metrics_out>/<encoder>/<variant>/<suite>.json, summary.json
    bootstrap: int = 10000  # resamples of the means' CIs
    seed: int = 0  # bootstrap seed


@dataclass
class ReportConfig:
    """The human report (``pipeline report``)."""

    out: str = "reports"  # report.md, figures/, plots/
    bootstrap: int = 10000  # paired-bootstrap resamples for CIs
    seed: int = 0  # bootstrap seed
    examples: int = 4  # example images per suite
    head_to_head: list[str] = field(default_factory=lambda: ["clip", "bindclip", "global-m", "flowclip", "flowclip-cimr"])  # the cross-family table's variants (those scored)
    encoders: str = "reports/encoders/summary.json"  # `pipeline compare-encoders`' summary, shown when present


def load_config(cls: type[C], params: str | Path | None, section: str, overrides: dict[str, Any] | None = None) -> C:
    """Build ``cls`` from ``params[section]`` (if the file exists) and non-None overrides.

    Unknown keys raise with the valid field names.
    """
    values = dict(_section(params, section))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _build(cls, values, section)


def _section(params: str | Path | None, section: str) -> dict[str, Any]:
    if params is None or not Path(params).exists():
        return {}
    return (yaml.safe_load(Path(params).read_text()) or {}).get(section) or {}


def _build(cls: type[C], values: dict[str, Any], section: str) -> C:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(
            f"unknown {section} parameter(s) {unknown}; valid: {', '.join(sorted(names))}"
        )
    return cls(**values)


def train_variants(params: str | Path | None) -> list[str]:
    """The trainable variants ``params.yaml`` lists under ``train.variants``."""
    return list(_section(params, "train").get("variants") or [])


def load_train_config(params: str | Path | None, variant: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """``TrainConfig`` of ``variant`` from ``params["train"][variant]`` plus overrides."""
    train = _section(params, "train")
    values = dict(train.get(variant) or {})
    if params is not None and Path(params).exists() and variant not in train:
        listed = ", ".join(k for k in train if k != "variants") or "none"
        raise ValueError(f"{params} has no train.{variant} section; trainable sections: {listed}")
    values.update({k: v for k, v in (overrides or {}).items() if v is not None}, variant=variant)
    return _build(TrainConfig, values, f"train.{variant}")
