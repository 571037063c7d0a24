"""Comparing two feature stores array by array (crash, repair and distributed tests), or one
store's files byte by byte before and after a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

VOLATILE = {"created", "updated"}  # timestamps


def file_bytes(path: Path) -> dict[Path, bytes]:
    """Every file under ``path`` and its bytes: what "changes no byte of the store" compares."""
    return {p: p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def store_contents(path: Path) -> dict:
    """Every array's values and every group's attributes (timestamps left out)."""
    root = zarr.open_group(path, mode="r")
    out = {"/": {k: v for k, v in root.attrs.items() if k not in VOLATILE}}
    for name, node in root.members(max_depth=None):
        if isinstance(node, zarr.Array):
            out[name] = (node.dtype, node[...])
        else:
            out[name + "/"] = {k: v for k, v in node.attrs.items() if k not in VOLATILE}
    return out


def assert_same_store(a: Path, b: Path, rounding: dict[str, float] | None = None) -> None:
    """Every array and attribute equal; arrays named in ``rounding`` within its absolute
    tolerance (features re-encoded in another batch), the rest bit for bit."""
    ca, cb = store_contents(a), store_contents(b)
    assert sorted(ca) == sorted(cb)
    for name in ca:
        if name.endswith("/"):
            assert ca[name] == cb[name], name
        elif rounding and name in rounding:
            assert ca[name][0] == cb[name][0], name
            np.testing.assert_allclose(ca[name][1], cb[name][1], rtol=0, atol=rounding[name], err_msg=name)
        else:
            assert ca[name][0] == cb[name][0] and np.array_equal(ca[name][1], cb[name][1]), name
