"""What the trial scripts share: a trial's folder and its ``params.yaml``, away from the
pipeline's outputs (``scripts/bindclip_trial.py``, ``scripts/flowclip_trial.py``), and
their entry point (:func:`run_main`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import yaml

NEEDS_CACHE = (
    "the trial scripts read the cache `dvc repro` fills (docs/trials.md's rows assume it); "
    "a row run with --params P reads P's store: `pipeline extract --params P` first"
)


def run_main(main: Callable[[], object]) -> None:
    """Run a trial script's ``main``; a missing or refused cache, a missing file or a bad
    parameter ends it with one ``error:`` line (as the ``pipeline`` command does), not a
    traceback."""
    from pipeline.cache.schema import CacheError
    from pipeline.config import ParamsError

    try:
        main()
    except CacheError as e:
        sys.exit(f"error: {e} ({NEEDS_CACHE})")
    except (FileNotFoundError, ParamsError) as e:
        sys.exit(f"error: {e}")


def shared_word_pairs(names: list[str]):
    """[n, n] bool: the pairs of different phrases among ``names`` that share a word ("red
    circle" against "blue circle"), the hard pairs of the ridge map's held-out AUC."""
    import numpy as np
    import torch

    vocab = {w: i for i, w in enumerate(sorted({w for n in names for w in n.split()}))}
    bag = torch.zeros(len(names), len(vocab))  # [n, V] which words each phrase has
    for i, n in enumerate(names):
        bag[i, [vocab[w] for w in n.split()]] = 1.0
    ids = torch.as_tensor(np.unique(names, return_inverse=True)[1])
    return ((bag @ bag.T) > 0) & (ids[:, None] != ids[None, :])


def write_trial_params(params: dict, out: Path, name: str) -> tuple[Path, Path]:
    """``(out/name, out/name/params.yaml)`` with ``params`` written there; the folder is made."""
    root = out / name
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return root, path
