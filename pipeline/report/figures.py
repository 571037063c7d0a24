"""The report's generic figures (matplotlib, Agg): returned, never saved (the stage saves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def examples_figure(entry: dict[str, Any], n: int):
    """``n`` random items of a suite (seed 0): the image as the encoder saw it (cut to the
    item's ``crop_box`` where the manifest has one, as ARO's VG items), caption options (✓ the
    true one) and each variant's score per option; None when nothing was scored or ``n`` is 0
    (``report.examples: 0``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.manifests import decode_image, read_image_bytes

    manifest = entry["manifest"]
    if not entry["scores"] or len(manifest) == 0 or n == 0:
        return None
    rng = np.random.default_rng(0)
    picks = rng.choice(len(manifest), size=min(n, len(manifest)), replace=False)
    fig, axes = plt.subplots(1, len(picks), figsize=(3.4 * len(picks), 4.2))
    axes = np.atleast_1d(axes)
    for ax, i in zip(axes, picks, strict=True):
        row = manifest.iloc[int(i)]
        root, crop = Path(entry["image_root"]), row["crop_box"] if "crop_box" in row else None
        try:
            data = read_image_bytes(root, row["image"])
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"{e}: the report's example images read each suite's image root; restore it (the shapes "
                "world's: `pipeline world`), or set report.examples: 0"
            ) from None
        ax.imshow(decode_image(data, str(root / row["image"]), crop))
        ax.set_xticks([])
        ax.set_yticks([])
        text = []
        for k, cap in enumerate(list(row["captions"])[:5]):
            mark = "✓" if k == int(row["correct"]) else " "
            scores = " ".join(
                f"{v}:{s[i, k]:.3f}" for v, s in entry["scores"].items() if k < s.shape[1]
            )
            text.append(f"{mark} {cap[:38]}\n    {scores}")
        ax.set_title(str(row["category"]), fontsize=9)
        ax.set_xlabel("\n".join(text), fontsize=6.5, loc="left")
    fig.tight_layout()
    return fig
