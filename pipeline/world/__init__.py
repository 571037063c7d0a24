"""The shapes world: procedural scenes with exact ground truth, and the suites built on them.

Modules, in dependency order:

* ``scenes``: vocabulary, seeding (``scene_rng``), hash splits (``split_of``), the scene
  graph (``Obj``, ``Scene``), geometry and three-valued relations, samplers;
* ``render``: Pillow rendering (anti-aliased, textured background) and PNG bytes;
* ``captions``: claims, their truth in a scene, templates, paraphrases, flips,
  grounding, the ARO word-order shuffles, BPE length;
* ``suites``: the evaluation suites item by item (What'sUp, ARO, SugarCrepe, retrieval) and
  the object columns (``object_names``, ``object_boxes``, ``phrases``, ``relations``);
* ``multi``: shapes-multi, galleries of near-duplicate 3-5-object scenes;
* ``families``: shapes-train / shapes-dev pairs of the eight families, with
  counterfactual and mirrored images;
* ``batches``: ``training_batch`` for the toy CLIP;
* ``build``: ``build_world`` writes images, manifests and ``world.json``.

See ``/work/shared/design/world.md`` for the design.
"""

from pipeline.world.batches import colourless_training_batch, training_batch, training_scene
from pipeline.world.build import SUITE_SPECS, WORLD_VERSION, build_world, suite_items, validate
from pipeline.world.captions import Caption, Has, Ref, Rel, Side, caption, paraphrase, say, truth
from pipeline.world.families import FAMILIES, pair_item
from pipeline.world.render import png_bytes, render
from pipeline.world.scenes import (
    COLOURS,
    RELATIONS,
    SHAPES,
    SIZES,
    SPLITS,
    Obj,
    Scene,
    bucket_of,
    scene_rng,
    split_of,
)
from pipeline.world.suites import ARO_CATEGORIES, SUGARCREPE_CATEGORIES, Item

__all__ = [
    "ARO_CATEGORIES",
    "COLOURS",
    "FAMILIES",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "SUGARCREPE_CATEGORIES",
    "SUITE_SPECS",
    "WORLD_VERSION",
    "Caption",
    "Has",
    "Item",
    "Obj",
    "Ref",
    "Rel",
    "Scene",
    "Side",
    "bucket_of",
    "build_world",
    "caption",
    "pair_item",
    "paraphrase",
    "png_bytes",
    "render",
    "say",
    "scene_rng",
    "split_of",
    "suite_items",
    "training_batch",
    "colourless_training_batch",
    "training_scene",
    "truth",
    "validate",
]
