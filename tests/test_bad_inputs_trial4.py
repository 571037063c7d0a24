"""Bad inputs found by the fourth new-user trial (issue 24) outside the loaders
(``tests/test_bad_inputs_loaders.py``): store paths and locks, the scheduler's address, and
the world's and toy CLIP's sizes. Each gives one line naming the input and the fix."""

from __future__ import annotations

import json
import logging
import os

import pytest

from pipeline.cache import CacheError, FeatureStore
from pipeline.cache.lock import StoreLockedError, lock_path, store_lock
from tests.test_bad_inputs import cli, refused

pytestmark = pytest.mark.bad_input


def test_a_relative_store_path_that_is_absent_is_shown_absolute(tmp_path, monkeypatch):
    """Run from another folder, a relative ``extract.out`` named only the relative path, and
    its advice (`pipeline extract`) would have built a second store there."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CacheError, match=rf"no feature store at features/x.zarr \({tmp_path}/features/x.zarr: relative paths in the params are read from the current folder\)"):
        FeatureStore.open("features/x.zarr")


@pytest.mark.parametrize(
    ("section", "values", "says"),
    [
        ("world", {"image_size": 100000}, "world.image_size = 100000: expected less than or equal to 1024"),
        ("toyclip", {"pool_size": 64}, "toyclip.batch_size 128 exceeds pool_size 64"),
    ],
)
def test_world_and_toy_clip_sizes_are_refused_by_their_section(tmp_path, section, values, says):
    """A 100,000-pixel world ran a minute and ended with a broken process pool; a batch larger
    than its pool was refused without naming its section or file."""
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps({section: values}))
    refused(cli(section, "--params", params), f"{params}: {says}")


def test_reclaiming_a_lock_says_why_it_is_stale(tmp_path, caplog):
    """A lock naming a live pid of this host (pid 1) was reclaimed "since None (it is no
    longer running)"; what makes it stale is that no process holds its lock."""
    store = tmp_path / "x.zarr"
    lock_path(store).write_text(json.dumps({"pid": 1, "host": os.uname().nodename}))
    with caplog.at_level(logging.WARNING), store_lock(store):
        pass
    assert f"reclaiming the stale lock of pid 1 on {os.uname().nodename} (no process holds it: that extract has ended)" in caplog.text
    lock_path(store).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with caplog.at_level(logging.WARNING), store_lock(store, break_lock=True):
        pass
    assert "taking over the lock of pid 1 on elsewhere, another host (--break-lock)" in caplog.text


def test_a_dangling_link_where_the_lock_file_belongs_is_named(tmp_path):
    store = tmp_path / "x.zarr"
    lock_path(store).symlink_to(tmp_path / "gone" / "lock")
    with pytest.raises(StoreLockedError, match=r"the store's lock file, is a link to .*gone/lock, which cannot be opened: remove the link"), store_lock(store):
        pass


@pytest.mark.parametrize(
    ("scheduler", "says"),
    [("tcp://127.0.0.1:99999", "port 99999 is outside 1-65535"), ("local:0 ", "local:N needs a worker count N of at least 1")],
)
def test_a_scheduler_address_out_of_range_is_named_and_spaces_are_stripped(scheduler, says):
    from pipeline.distributed import cluster

    with pytest.raises(OSError if "port" in says else ValueError, match=says), cluster(scheduler):
        pass


def test_a_scheduler_address_with_a_trailing_space_is_read_without_it():
    """``local:1 `` (a pasted value) was refused as if its count were not a number."""
    from pipeline.distributed import cluster

    with cluster("local:1 ", quiet=True) as client:
        assert len(client.scheduler_info()["workers"]) == 1
