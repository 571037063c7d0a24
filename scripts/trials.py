"""What the trial scripts share: a trial's folder and its ``params.yaml``, away from the
pipeline's outputs (``scripts/bindclip_trial.py``, ``scripts/flowclip_trial.py``)."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_trial_params(params: dict, out: Path, name: str) -> tuple[Path, Path]:
    """``(out/name, out/name/params.yaml)`` with ``params`` written there; the folder is made."""
    root = out / name
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return root, path
