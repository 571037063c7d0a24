"""Run one extract that SIGKILLs itself at a named point (the crash tests' subprocess).

    python -m tests.crash_driver PARAMS POINT N [--scheduler local:2]

POINT is where the process dies, on the N-th time it gets there (1-based):

* ``plan``: rows planned, every array resized, their keys not yet written;
* ``encode``: inside the image encoder's forward pass;
* ``between_writes``: after N batch writes completed, before the next one starts;
* ``during_write``: inside a batch write, after its first data array, before its flags;
* ``index``: while the suite indexes are written, after every row;
* ``finalize``: after the last write, before the store is marked updated.
* ``first_task``: (with ``--scheduler``) in the client, once the first block's task has
  finished while the others still run on the workers;
* ``none``: no crash (the reference run).
"""

from __future__ import annotations

import os
import signal
import sys

from pipeline.cache import writer
from pipeline.config import ExtractConfig, load_config


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, n: int) -> None:
    """Patch the function at ``point`` to kill the process on its ``n``-th call."""
    calls = {"k": 0}

    def due() -> bool:
        calls["k"] += 1
        return calls["k"] >= n

    if point == "plan":
        original = writer.append_keys

        def append_keys(*a, **k):
            if due():
                die()
            return original(*a, **k)

        writer.append_keys = append_keys
    elif point == "encode":
        from pipeline.encoders import Encoder

        original = Encoder.encode_images

        def encode_images(self, pixels):
            if due():
                die()
            return original(self, pixels)

        Encoder.encode_images = encode_images
    elif point in ("between_writes", "during_write"):
        original = writer.write_rows

        def write_rows(root, modality, rows, arrays, done=None, handles=None):
            if point == "between_writes" and calls["k"] >= n:
                die()
            calls["k"] += 1
            if point == "during_write" and calls["k"] >= n:
                name, value = next(iter(arrays.items()))
                root[f"{modality}/{name}"].set_orthogonal_selection((rows,), value.astype(root[f"{modality}/{name}"].dtype))
                die()
            return original(root, modality, rows, arrays, done, handles)

        writer.write_rows = write_rows
    elif point == "index":
        original = writer.write_suite_index

        def write_suite_index(*a, **k):
            if due():
                die()
            return original(*a, **k)

        writer.write_suite_index = write_suite_index
    elif point == "first_task":
        import distributed

        original = distributed.as_completed

        def as_completed(futures, *a, **k):
            for future in original(futures, *a, **k):
                if due():
                    die()
                yield future

        distributed.as_completed = as_completed
    elif point == "finalize":
        writer.finalize = lambda root: die()
    elif point != "none":
        raise SystemExit(f"unknown crash point {point!r}")


def main(argv: list[str]) -> None:
    params, point, n = argv[0], argv[1], int(argv[2])
    scheduler = argv[argv.index("--scheduler") + 1] if "--scheduler" in argv else None
    cfg = load_config(ExtractConfig, params, "extract")
    arm(point, n)
    if scheduler:
        from pipeline.distributed import extract_distributed

        extract_distributed(cfg, scheduler, progress=False)
    else:
        from pipeline.extraction import extract

        extract(cfg, progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
