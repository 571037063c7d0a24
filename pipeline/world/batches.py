"""Training data for the toy CLIP: scenes from the train hash buckets, one positive caption.

``training_batch(seed, indices, image_size)`` renders scene ``index`` of the ``pool``
kind for each index, mapped into the train buckets (0-2) the same way the suites map
theirs (``scenes.scene_id_in_split``: the first of ``pool-s<seed>-<index>``, ``...r1``
... whose bucket is 0-2), so distinct indices give distinct scenes, none of them in a
validation or holdout bucket. Each comes with one random true caption mixing every kind
(object lists with colours and sizes, relations incl. depth, sides of the picture) and
every template. No hard negatives: the contrastive batch supplies the negatives.

Its speed is measured by ``scripts/bench_world.py`` (figures in docs/trials.md).
"""

from __future__ import annotations

import numpy as np

from pipeline.world.captions import N_STYLES, Claim, caption, describe
from pipeline.world.render import render
from pipeline.world.sampling import random_scene
from pipeline.world.scenes import Scene, scene_id_in_split, scene_rng

P_OVERLAP = 0.3  # share of training scenes with an overlapping (depth) pair
# Share of uniquely-shaped objects named by shape alone in training captions. With colours
# in (almost) every caption, colour alone picks the right image out of a contrastive batch,
# so the toy CLIP gets no gradient for shape.
P_BARE = 0.5
# Share of single-colour training scenes: colour cannot tell them apart within a batch, so
# the contrastive loss can only fall by reading shape (still positives + in-batch negatives).
P_MONO = 0.3


# Colour of every object in the colourless warm-up pool (see ``colourless_training_batch``).
COLOURLESS = "white"


def training_scene(seed: int, index: int, colourless: bool = False) -> tuple[Scene, Claim, int]:
    """``(scene, claim, style)`` of pool scene ``index`` (train buckets only).

    ``colourless``: the same scene with every object ``COLOURLESS`` and the claim naming
    objects by shape alone wherever the shape is unique (``p_bare = 1``).
    """
    sid, _ = scene_id_in_split(seed, "pool", int(index), "train")
    rng = scene_rng(seed, int(index), f"pool/{sid}")
    scene = random_scene(rng, sid, overlap_pair=bool(rng.random() < P_OVERLAP))
    mono = rng.random() < P_MONO
    if mono or colourless:
        colour = COLOURLESS if colourless else scene.objects[0].colour
        for i in range(len(scene.objects)):
            scene = scene.with_object(i, colour=colour)
    return scene, describe(scene, rng, p_bare=1.0 if colourless else P_BARE), int(rng.integers(N_STYLES))


def training_batch(
    seed: int, indices: np.ndarray, image_size: int = 64, colourless: bool = False
) -> tuple[np.ndarray, list[str]]:
    """Images and one positive caption each for pool scenes ``indices``.

    Returns:
        ``images`` [n, image_size, image_size, 3] uint8 and ``captions`` (n strings).
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.size and int(idx.min()) < 0:
        raise ValueError(f"indices must be >= 0, got min {int(idx.min())}")
    images = np.empty((len(idx), image_size, image_size, 3), dtype=np.uint8)  # [n, H, W, 3]
    captions = []
    for k, index in enumerate(idx):
        scene, claim, style = training_scene(seed, int(index), colourless)
        images[k] = render(scene, image_size)
        captions.append(caption(claim, style))
    return images, captions


def colourless_training_batch(
    seed: int, indices: np.ndarray, image_size: int = 64
) -> tuple[np.ndarray, list[str]]:
    """``training_batch`` with colour taken out: every object white, shapes named bare.

    The toy CLIP's warm-up pool: colour alone separates most of a batch of the full
    mixture, so without colour shape (and size, place) is all a batch offers and both
    towers get a gradient for it (the measurement is in ``docs/trials.md``). Still
    positives + in-batch negatives only.
    """
    return training_batch(seed, indices, image_size, colourless=True)
