r"""Query steering (methods.md §3): move a query's embedding along concept directions
before ranking the gallery by cosine, :math:`q' = \mathrm{normalise}(q + \beta v)`.

A direction contrasts two concept prompts, :math:`v = t(c^+) - t(c^-)` (unit-norm pooled
text embeddings). The suites write the prompts per query (``steer_pos`` / ``steer_neg``
columns, encoded at extract): in the shapes world :math:`c^+` is one of the query's object
phrases ("red circle") and :math:`c^-` the same object in another colour. The ``contrast``
option picks which: ``swap`` (``steer_neg``, the default) the colour of another object of the
query ("blue circle"), the binding CLIP confuses, so a query's directions share its colours;
``absent`` (``steer_neg_absent``) a colour none of its objects has ("white circle"), so they
share no concept, as the seed's separately summed concepts do.

* ``steer``: single-concept steering, the first direction only.
* ``steer-multi``: naive multi-object steering, every direction of the query summed into
  one vector; the paper reports that the sum interferes (CLEVR-HOPE R@10 0.230 -> 0.094),
  and the report measures whether it does here. A sum of n directions is up to n times as
  long as one (√n where they are orthogonal), so it also moves the query further: with ``length: one``
  each query's sum is rescaled to its first direction's length, which separates what the
  sum's direction does from what its length does.

Left alone, both rank the whole gallery by the steered cosine (as cheap as CLIP's): ``k``
defaults to a shortlist longer than any gallery. The pipeline's ``score.options`` set
``k: 20``, the seed's local steering: only CLIP's top 20 are re-ranked by the steered query,
the rest keep CLIP's order.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.benchmarks.retrieval import STEERING_NEGATIVES
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers.base import SCORERS, Reranker
from pipeline.scorers.geometry.objects import require_columns

WHOLE_GALLERY = 10**9
LENGTHS = ("sum", "one")  # steer along the sum as it is, or rescaled to the first direction's length
STEERING_NEEDED = (
    "steer and steer-multi need each query's concept prompts (steer_pos / steer_neg), which the shapes world's "
    "retrieval suites write and the COCO and Visual Genome loaders do not; leave them out of score.variants there"
)


class Steer(Reranker):
    """Rank by the cosine of the steered query; ``multi`` sums every direction, ``contrast``
    (a key of :data:`~pipeline.benchmarks.retrieval.STEERING_NEGATIVES`) picks the c- prompts
    and ``length`` (:data:`LENGTHS`) how long the summed vector is."""

    uses_grids = False
    scores_choices: ClassVar[bool] = False

    def __init__(
        self,
        beta: float = 0.5,
        multi: bool = False,
        k: int = WHOLE_GALLERY,
        base: str = "clip",
        contrast: str = "swap",
        length: str = "sum",
    ) -> None:
        super().__init__()
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not math.isfinite(beta):
            raise ValueError(f"steering's beta must be a finite number, got {beta!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:  # 2.5 or "20" is a typo, not a shortlist length
            raise ValueError(f"steering's k must be an integer >= 1, got {k!r}")
        if contrast not in STEERING_NEGATIVES:
            raise ValueError(f"steering's contrast must be one of {sorted(STEERING_NEGATIVES)}, got {contrast!r}")
        if length not in LENGTHS:
            raise ValueError(f"steering's length must be one of {list(LENGTHS)}, got {length!r}")
        self.beta, self.multi, self.k, self.base = float(beta), bool(multi), int(k), base
        self.contrast, self.length = contrast, length
        self._directions: torch.Tensor | None = None

    def prepare(self, store, manifest, index, suite: str = "") -> None:
        v, valid = concept_directions(store, manifest, index, suite, self.contrast)
        first = valid & (torch.cumsum(valid, dim=1) == 1)  # [n, n_dir] the first direction only
        summed = (v * (valid if self.multi else first)[..., None]).sum(1)  # [n, D]
        if self.length == "one":  # a query without directions keeps its zero vector
            one = (v * first[..., None]).sum(1).norm(dim=-1)
            summed = summed * (one / summed.norm(dim=-1).clamp(min=1e-12))[:, None]
        self._directions = summed

    def rerank(self, query: TextFeatures, candidates: ImageFeatures, shortlist: torch.Tensor, gallery=None, queries=None) -> torch.Tensor:
        if self._directions is None or queries is None:
            raise RuntimeError("steering ranks retrieval suites only, after prepare()")
        q = F.normalize(F.normalize(query.embed, dim=-1) + self.beta * self._directions[queries], dim=-1)  # [Q, D]
        img = F.normalize(candidates.embed, dim=-1)[shortlist]  # [Q, K, D]
        return torch.einsum("qd,qkd->qk", q, img)


def concept_directions(store, manifest, index, suite: str = "", contrast: str = "swap") -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's directions :math:`t(c^+) - t(c^-)` ([n, n_dir, D], zero where padded)
    and which are real ([n, n_dir] bool), from the ``steer_pos`` rows and the ``contrast``'s c-
    rows extract encoded; a suite without the prompts, or with unpaired ones, is refused."""
    negatives = STEERING_NEGATIVES[contrast]
    require_columns(manifest, ("steer_pos", negatives), suite, STEERING_NEEDED)
    if "steer_pos" not in index or negatives not in index:
        raise ValueError(f"the store has no steer_pos/{negatives} rows for {suite}: rerun `pipeline extract`")
    pos, neg = (index[c].reshape(len(manifest), -1) for c in ("steer_pos", negatives))
    if not np.array_equal(pos >= 0, neg >= 0):
        raise ValueError(f"{suite}: steer_pos and {negatives} must pair up prompt by prompt")
    valid = torch.from_numpy(pos >= 0)  # [n, n_dir]
    v = torch.zeros(*pos.shape, store.dims.embed_dim)
    for rows, sign in ((pos, 1.0), (neg, -1.0)):
        v[valid] += sign * F.normalize(store.texts(rows[pos >= 0], grids=False).embed, dim=-1)
    return v, valid


def _steer_options(kwargs: dict) -> dict:
    """The steering factories' options; an unknown one (a typo in ``score.options``) is refused."""
    unknown = sorted(set(kwargs) - {"beta", "k", "base", "contrast", "length"})
    if unknown:
        raise TypeError(f"unknown steering options {unknown}; valid: ['base', 'beta', 'contrast', 'k', 'length']")
    return dict(kwargs)


@SCORERS.register("steer")
def steer(dims: FeatureDims, proj: Projections, **kwargs) -> Steer:
    """CLIP retrieval with the query steered along its first concept direction."""
    return Steer(**_steer_options(kwargs))


@SCORERS.register("steer-multi")
def steer_multi(dims: FeatureDims, proj: Projections, **kwargs) -> Steer:
    """CLIP retrieval with every concept direction of the query summed into one (naive)."""
    return Steer(multi=True, **_steer_options(kwargs))
