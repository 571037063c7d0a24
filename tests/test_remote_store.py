"""Feature stores at fsspec URLs (memory://, file://): the same store, fingerprint, resume,
integrity and refusal as a local folder."""

from __future__ import annotations

import dataclasses
import os
import uuid

import numpy as np
import pytest

from pipeline.cache import (
    CorruptStoreError,
    FeatureStore,
    ForeignCacheError,
    StoreLockedError,
    store_lock,
    store_path,
)
from pipeline.cache.location import StoreLocation
from pipeline.cache.schema import CacheError
from pipeline.config import ExtractConfig
from pipeline.extraction import extract
from tests.conftest import make_choice_manifest, make_images


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("remote")
    make_choice_manifest(tmp / "sc.parquet", make_images(tmp / "images", 12, size=28))
    return tmp


def _cfg(suite, out: str) -> ExtractConfig:
    return ExtractConfig(
        model="tiny-test", suites=["shapes-sugarcrepe"], manifests={"shapes-sugarcrepe": str(suite / "sc.parquet")},
        image_roots={"shapes-sugarcrepe": str(suite / "images")}, out=out, batch_size=4,
    )  # fmt: skip


@pytest.fixture(scope="module")
def local(suite, tiny_encoder):
    cfg = _cfg(suite, str(suite / "local"))
    extract(cfg, progress=False, encoder=tiny_encoder)
    return FeatureStore.open(store_path(cfg))


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_url_store_equals_local_store_and_resumes(scheme, suite, tiny_encoder, local, tmp_path):
    out = f"memory://{uuid.uuid4().hex}/features" if scheme == "memory" else f"file://{tmp_path}/features"
    cfg = _cfg(suite, out)
    first = extract(cfg, progress=False, encoder=tiny_encoder)
    assert first["images"]["encoded"] == 12 and str(first["store"]).startswith(f"{scheme}://")
    again = extract(cfg, progress=False, encoder=tiny_encoder)
    assert again["images"]["encoded"] == 0 and again["captions"]["encoded"] == 0  # resumed: nothing new
    remote = FeatureStore.open(store_path(cfg), expect=local.fingerprint)
    rows = np.arange(12)
    assert np.array_equal(remote.images(rows).final.numpy(), local.images(rows).final.numpy())
    assert np.array_equal(remote.texts(rows).embed.numpy(), local.texts(rows).embed.numpy())
    with pytest.raises(ForeignCacheError, match="early_layer"):
        FeatureStore.open(store_path(cfg), expect={**local.fingerprint, "early_layer": 9})


def test_url_store_missing_chunk_is_named(suite, tiny_encoder):
    cfg = _cfg(suite, f"memory://{uuid.uuid4().hex}/features")
    extract(cfg, progress=False, encoder=tiny_encoder)
    loc = StoreLocation.of(store_path(cfg))
    loc.delete_file(f"{store_path(cfg)}/image/embed/c/0/0")
    with pytest.raises(CorruptStoreError, match=r"image/embed rows 0-.*--repair"):
        FeatureStore.open(store_path(cfg))


def test_a_file_url_and_its_path_share_one_flock(tmp_path):
    """``file://`` is a local folder: its lock is the path's ``flock``, so an extract given
    the URL and one given the path refuse each other, and a killed holder's lock is stale
    by construction (no --break-lock needed)."""
    path = tmp_path / "features" / "x.zarr"
    for first, second in ((f"file://{path}", path), (path, f"file://{path}")):
        with store_lock(first):
            with pytest.raises(StoreLockedError, match="is being written by pid"), store_lock(second):
                pass
    with store_lock(f"file://{path}"):  # released above: taken again at once
        pass


def test_url_store_lock_refuses_a_second_writer_and_breaks(suite):
    store = f"memory://{uuid.uuid4().hex}/features/x.zarr"
    with store_lock(store):
        with pytest.raises(StoreLockedError, match="--break-lock"), store_lock(store):
            pass
        with store_lock(store, break_lock=True):
            pass


def test_a_garbled_url_lock_is_an_unknown_holder_and_is_broken():
    """A lock object whose bytes are not UTF-8 reads as a record nobody wrote: refused with
    --break-lock named, then taken over with it (not a UnicodeDecodeError)."""
    store = f"memory://{uuid.uuid4().hex}/features/x.zarr"
    loc = StoreLocation.of(store)
    loc._fs()[0].pipe_file(f"{loc._fs()[1]}.lock", b"\xff\xfe garbage")
    with pytest.raises(StoreLockedError, match="--break-lock"), store_lock(store):
        pass
    with store_lock(store, break_lock=True) as holder:
        assert holder["pid"] == os.getpid()


def test_a_file_url_writes_through_zarrs_local_store(tmp_path):
    """``file://`` opens through ``LocalStore`` like the plain path, whose files are written
    whole and renamed into place (fsspec's local file system writes in place: a killed
    extract could leave a chunk or zarr.json cut short)."""
    from zarr.storage import LocalStore

    root = StoreLocation.of(f"file://{tmp_path}/deep/x.zarr").open("w")
    assert isinstance(root.store, LocalStore) and (tmp_path / "deep" / "x.zarr" / "zarr.json").is_file()


def test_storage_options_reach_the_filesystem(suite, tmp_path):
    url = f"file://{tmp_path}/not/yet/there"
    StoreLocation.of(f"{url}/a.zarr", {}).open("w")  # file:// makes folders by default
    refused = dataclasses.replace(_cfg(suite, f"file://{tmp_path}/other/folder"), storage_options={"auto_mkdir": False})
    with pytest.raises(FileNotFoundError):  # the option reached fsspec's filesystem
        StoreLocation.of(store_path(refused), refused.storage_options).open("w")


def test_a_local_url_is_a_file_url(suite, tiny_encoder, tmp_path):
    """``local://`` (fsspec's other name for ``file://``) is a local store like ``file://``: an
    extract there creates its folders, and the local lock guards it as it guards the path."""
    path = tmp_path / "features"
    summary = extract(_cfg(suite, f"local://{path}"), progress=False, encoder=tiny_encoder)
    assert str(summary["store"]).startswith("file://") and summary["images"]["encoded"] == 12
    again = extract(_cfg(suite, str(path)), progress=False, encoder=tiny_encoder)  # the same store, as a path
    assert again["images"]["encoded"] == 0
    with store_lock(f"local://{path}/tiny-test.zarr"):
        with pytest.raises(StoreLockedError, match="is being written by pid"), store_lock(path / "tiny-test.zarr"):
            pass


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("file:cache/features", "reads as a file URL without its '//': write file://"),
        ("fiel:///tmp/features", "fsspec knows no protocol 'fiel'"),
        ("file:///tmp/a%20b/features", "file:// URLs are read without decoding %XX escapes"),
    ],
)
def test_a_store_address_that_cannot_mean_what_it_says_is_refused_before_the_model_loads(suite, monkeypatch, tmp_path, out, says):
    """A one-colon ``file:`` (which would make a local folder named ``file:cache``), a ``%20``
    (a folder named with it) and an unknown protocol are refused before the model loads."""
    import pipeline.extraction

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pipeline.extraction, "load_encoder", no_model)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CacheError, match=f"extract.out = .*{says}"):
        extract(_cfg(suite, out), progress=False)
    assert list(tmp_path.iterdir()) == []


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("http://127.0.0.1:9/features", "fsspec's http:// filesystem is read-only here"),
        ("tar://features", "fsspec's tar:// filesystem is read-only here"),
        ("simplecache::http://127.0.0.1:9/features", "fsspec's http:// filesystem is read-only here"),
        ("ftp://127.0.0.1:{port}/features", r"cannot be reached \(ConnectionRefusedError"),
        ("zip://features", r"cannot be reached \(IsADirectoryError"),
    ],
)
@pytest.mark.parametrize("scheduler", [None, "local:1"])
def test_a_store_url_that_cannot_be_written_is_refused_before_the_model_loads(suite, monkeypatch, tmp_path, out, says, scheduler):
    """A read-only protocol, a refused connection or an archive filesystem without its
    archive is refused before the model loads and before any cluster starts."""
    import pipeline.distributed
    import pipeline.encoders
    import pipeline.extraction

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pipeline.extraction, "load_encoder", no_model)
    monkeypatch.setattr(pipeline.encoders, "load_encoder", no_model)
    monkeypatch.setattr(pipeline.distributed, "cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(suite, out.format(port=_closed_port()))
    with pytest.raises(CacheError, match=f"extract.out = .*{says}"):
        if scheduler:
            pipeline.distributed.extract_distributed(cfg, scheduler, progress=False)
        else:
            extract(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_writable_url_passes_the_check_before_its_store_exists(tmp_path):
    StoreLocation.of(f"file://{tmp_path}/not/yet/a.zarr").check_writable()
    StoreLocation.of(f"memory://check-{uuid.uuid4().hex}/a.zarr").check_writable()
    StoreLocation.of(tmp_path / "local.zarr").check_writable()  # a path: checked when its folder is made
    assert list(tmp_path.iterdir()) == []


def test_a_store_url_that_cannot_be_reached_is_named_when_read():
    """Reading (``score``, ``report``) from an address nothing answers names the address and
    the filesystem's reason, not a bare ``[Errno 111] Connection refused``."""
    loc = StoreLocation.of(f"ftp://127.0.0.1:{_closed_port()}/features/toy.zarr")
    for ask in (loc.exists, loc.has_content):
        with pytest.raises(CacheError, match=r"the feature store = 'ftp://127\.0\.0\.1:\d+/features/toy\.zarr' cannot be reached \(ConnectionRefusedError"):
            ask()
