"""Stage `images`: record which images extract's suites name are present, by ``stat`` alone.

I/O and orchestration only: the record is :func:`pipeline.manifests.image_presence`, one per
suite of ``extract.suites``, written as one JSON file. A DVC pipeline runs this stage every
time (``always_changed``) and makes extract depend on its file, so an image that appears
after an extract that skipped it (``extract.skip_missing``), or one rewritten in place,
reruns extract; when nothing changed the file's bytes are the same and extract is skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.benchmarks import SUITES
from pipeline.config import ExtractConfig
from pipeline.files import write_json_atomically
from pipeline.manifests import cells, image_presence, read_manifest, resolve_source

log = logging.getLogger(__name__)


def run(cfg: ExtractConfig, out: str | Path) -> dict[str, int]:
    """Write ``out`` (``{"suites": {suite: image_presence(...)}}``); returns {suite: images
    missing}. Raises what :func:`pipeline.manifests.resolve_source` raises for a suite
    without a manifest."""
    record = {}
    for name in cfg.suites:
        src = resolve_source(name, cfg.world, cfg.manifests, cfg.image_roots)
        df = read_manifest(src.manifest)
        paths = [rel for col in SUITES.get(name).image_columns if col in df for row in cells(df[col]) for rel in row]
        record[name] = image_presence(src.image_root, paths)
        if record[name]["missing"]:
            log.info("%s: %d of %d images missing under %s", name, len(record[name]["missing"]), record[name]["images"], src.image_root)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out, {"suites": record}, indent=1, sort_keys=True)
    return {name: len(r["missing"]) for name, r in record.items()}
