"""The hook a trainable scorer family gives the training loop.

The loop (:mod:`pipeline.training.loop`) knows seeds, resume, AdamW and its schedule,
checkpoint selection and the checkpoint layout, and nothing about any family. A family
says what its data is, what one step's loss is and how the dev suite is scored by
returning a :class:`FamilyTrainer` from its scorer's ``make_trainer(objective)``
(``objective`` is the family's ``train.<variant>.objective`` section of ``params.yaml``).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.benchmarks.base import SuiteSelection
from pipeline.cache import FeatureStore


class FamilyTrainer:
    """A family's data, losses and dev metric, for :func:`pipeline.training.loop.train_variant`.

    Subclasses implement :meth:`load`, :meth:`n_items`, :meth:`loss` and :meth:`dev_metrics`;
    :meth:`select` is optional (e.g. BindCLIP chooses its consensus ``q0`` on dev there).
    """

    def load(self, store: FeatureStore, suite: SuiteSelection, train: bool) -> Any:
        """The selected rows' data, read once (``train``: the training suite, else the dev
        suite); ``suite`` holds the selection and its sample (``SuiteSelection.mask``)."""
        raise NotImplementedError

    def n_items(self, data: Any) -> int:
        """How many items the loop draws batches from."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, data: Any, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The total loss of the items ``batch`` ([B] indices) and what to log (floats;
        ``total`` is logged by the loop, ``acc`` shown on the progress bar when given)."""
        raise NotImplementedError

    def dev_metrics(self, model: torch.nn.Module, data: Any, suite: str) -> dict[str, float]:
        """The dev suite's official metrics; ``mean`` selects the checkpoint (higher wins)."""
        raise NotImplementedError

    def select(self, model: torch.nn.Module, data: Any, suite: str) -> dict[str, Any]:
        """After training, on the selected weights: scorer options chosen on dev (set on
        ``model`` and returned, so that scoring rebuilds the scorer with them) and what
        to record of the choice (``{"scorer_kwargs": {...}, "record": {...}}``)."""
        return {"scorer_kwargs": {}, "record": {}}
