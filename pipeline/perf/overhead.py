"""What one ``pipeline score`` call costs beyond the scoring itself.

A researcher re-scores from the cache many times; each call is a fresh process that imports
the library, reads the params, opens the store and checks its fingerprint (which names the
weights by their sha256) before it scores. :func:`score_overhead` extracts a small suite with
a random-init encoder whose weights are a real file (so the fingerprint check has a file to
hash), then times

* ``cli_cold_s``: the first ``pipeline score`` subprocess, with an empty weights-hash cache
  (it hashes the weights file once);
* ``cli_s``: later calls (median), which find the hash by (path, size, mtime);
* ``score_s``: the same scoring inside a warm process (``stages.score.run``, median);
* ``import_s``: a bare ``python -c 'import pipeline.cli, stages.score'`` (median);

and reports ``overhead_s = cli_s - score_s`` against the goal of at most 3 s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from pipeline.perf.common import make_suite

GOAL_S = 3.0  # overhead of one `pipeline score` call over its scoring


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t0


def score_overhead(score_run: Callable[..., Any], model: str = "ViT-B-32", items: int = 100, repeats: int = 3, threads: int = 2) -> dict[str, Any]:
    """Wall time of ``pipeline score`` on ``items`` SugarCrepe-style items against its
    scoring time, for ``model`` at random init saved as a weights file (see the module
    docstring for each figure). ``score_run(cfg, ext, progress=False)`` is the score
    stage's ``run``, which the CLI passes in (the library never imports ``stages``)."""
    from safetensors.torch import save_file

    from pipeline.config import ExtractConfig, ScoreConfig
    from pipeline.encoders import load_encoder
    from pipeline.extraction import extract

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        encoder = load_encoder(model, "none", init_seed=0)
        weights = folder / f"{model}-random.safetensors"
        state = {k: v.contiguous() for k, v in encoder.model.state_dict().items()}
        save_file(state, str(weights))
        del encoder, state
        manifest = make_suite(folder, items, 224)
        extract_section = {
            "model": model, "pretrained": str(weights), "suites": ["shapes-sugarcrepe"],
            "manifests": {"shapes-sugarcrepe": str(manifest)}, "image_roots": {"shapes-sugarcrepe": str(folder / "images")},
            "out": str(folder / "features"), "batch_size": 32, "threads": threads,
        }  # fmt: skip
        score_section = {
            "variants": ["clip"], "suites": ["shapes-sugarcrepe"], "encoder": model, "checkpoints": str(folder / "none"),
            "scores_out": str(folder / "scores"), "metrics_out": str(folder / "metrics"),
        }  # fmt: skip
        params = folder / "params.yaml"
        params.write_text(yaml.safe_dump({"extract": extract_section, "score": score_section}))
        torch.set_num_threads(threads)
        extract(ExtractConfig(**extract_section), progress=False)

        env = {**os.environ, "PIPELINE_HASH_CACHE": str(folder / "hashes.json"), "OMP_NUM_THREADS": str(threads)}
        cli = [str(bin_dir / "pipeline"), "score", "--params", str(params), "--quiet"]
        cold = _timed(cli, env, folder)
        warm = [_timed(cli, env, folder) for _ in range(repeats)]
        imports = [_timed([sys.executable, "-c", "import pipeline.cli, stages.score"], env, folder) for _ in range(repeats)]

        ext, cfg = ExtractConfig(**extract_section), ScoreConfig(**score_section)
        in_process = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            score_run(cfg, ext, progress=False)
            in_process.append(time.perf_counter() - t0)
        size_mb = weights.stat().st_size / 2**20

    cli_s, score_s = statistics.median(warm), statistics.median(in_process)
    return {
        "model": model, "weights": f"random init saved as a {size_mb:.0f} MB safetensors file", "items": items,
        "threads": threads, "load_avg_1min": round(os.getloadavg()[0], 2),
        "cli_cold_s": round(cold, 2), "cli_s": round(cli_s, 2), "score_s": round(score_s, 3),
        "import_s": round(statistics.median(imports), 2), "overhead_s": round(cli_s - score_s, 2),
        "goal": f"overhead_s <= {GOAL_S}",
    }  # fmt: skip
