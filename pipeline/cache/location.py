"""Where a store lives: a local folder or an fsspec URL (``s3://``, ``gs://``, ``memory://``,
``file://``), opened the same way.

    loc = StoreLocation.of("s3://bucket/features/toy.zarr", {"anon": False})
    loc.exists(); root = loc.open("r+"); loc.remove()

Local paths and ``file://`` URLs without storage options go through zarr's ``LocalStore``
(atomic file writes); other URLs through ``FsspecStore`` with the storage options of
``extract.storage_options`` (credentials, endpoints). ``s3://`` needs ``s3fs`` and ``gs://``
needs ``gcsfs``: the ``remote`` extra (``pip install -e '.[remote]'``). Everything above the
store (fingerprint, resume, integrity, refusal) only sees a ``zarr.Group``, so it works the
same on both.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zarr

from pipeline.cache.schema import CacheError

#: fsspec protocols that read but cannot hold a store being written (no in-place rewrite)
READ_ONLY_PROTOCOLS = frozenset({"http", "https", "github", "git", "tar", "libarchive", "reference", "data"})


def is_url(path: str | Path) -> bool:
    """Whether ``path`` is an fsspec URL (``scheme://...``) rather than a local path."""
    return "://" in str(path)


def check_address(address: str | Path, key: str = "extract.out") -> str | Path:
    """``address`` (the value of ``key``) as the store code reads it, refused when it cannot
    mean what it says, before any model is loaded or file written: a URL of a protocol fsspec
    does not know, or whose package is not installed; a known protocol followed by one colon
    and no ``//`` (``file:cache/features``, which would be a local folder of that name); a
    ``file://`` URL with ``%XX`` escapes (fsspec reads them literally, another folder than the
    decoded one). ``local://``, fsspec's other name for ``file://``, is returned as ``file://``,
    so both spellings share one lock and one folder-creating filesystem."""
    import re

    import fsspec

    text = str(address)
    if not is_url(text):
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)", text)
        if scheme and scheme.group(1).lower() in fsspec.available_protocols():
            raise CacheError(f"{key} = {text!r} reads as a {scheme.group(1)} URL without its '//': write {scheme.group(1)}://...")
        return address
    if text.startswith("local://"):
        text = "file://" + text.removeprefix("local://")
    for part in text.split("::"):  # a chained URL (simplecache::s3://...): every protocol in it
        protocol = part.split("://")[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError:
            raise CacheError(f"{key} = {text!r}: fsspec knows no protocol {protocol!r} (e.g. file://, s3://, gs://)") from None
        except ImportError as e:  # a protocol whose fsspec package is not installed: the user's to add
            raise CacheError(f"{key} = {text!r}: {e}; install the remote-store extra: pip install -e '.[remote]'") from None
    if text.startswith("file://") and re.search(r"%[0-9A-Fa-f]{2}", text):
        raise CacheError(f"{key} = {text!r}: file:// URLs are read without decoding %XX escapes; write the folder's name as it is (spaces are fine)")
    return text


@dataclass(frozen=True)
class StoreLocation:
    """A store's address and, for a URL, its fsspec storage options."""

    path: str | Path
    storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, path: str | Path, storage_options: dict[str, Any] | None = None) -> StoreLocation:
        """The location of ``path``, checked and normalised by :func:`check_address`."""
        path = check_address(path, "store address")
        return cls(str(path) if is_url(path) else Path(path), dict(storage_options or {}))

    def __str__(self) -> str:
        return str(self.path)

    @property
    def remote(self) -> bool:
        return is_url(self.path)

    def _fs(self) -> tuple[Any, str]:
        import fsspec

        return fsspec.core.url_to_fs(str(self.path), **self._options())

    def _options(self) -> dict[str, Any]:
        if str(self.path).startswith("file://"):
            return {"auto_mkdir": True, **self.storage_options}
        return self.storage_options

    def check_writable(self, key: str = "extract.out") -> None:
        """Refuse, before any model is loaded, a URL that cannot take a store being written: a
        read-only protocol (:data:`READ_ONLY_PROTOCOLS`), or a filesystem that cannot be
        reached with its storage options (a refused connection, a missing archive or
        library). Without this such an address fails only at the first write, after the
        model has loaded. A local path is checked when its folder is made."""
        if not self.remote:
            return
        protocols = [part.split("://")[0].lower() for part in str(self.path).split("::")]  # every link of a chain
        if read_only := [p for p in protocols if p in READ_ONLY_PROTOCOLS]:
            raise CacheError(f"{key} = {str(self.path)!r}: fsspec's {read_only[0]}:// filesystem is read-only here, and a store is written; extract into file://, s3://, gs:// or a local folder (score can read a copy from anywhere)")
        self._reach(lambda fs, root: fs.exists(root), key)

    def _reach(self, ask, key: str = "the feature store") -> Any:
        """``ask(fs, root)`` on this remote location's filesystem; any failure to reach it (a
        refused connection, a missing library or archive) is a :class:`CacheError` naming
        ``key``, the address and the filesystem's own message, the user's clue."""
        try:
            return ask(*self._fs())
        except Exception as e:  # any filesystem's failure
            raise CacheError(f"{key} = {str(self.path)!r} cannot be reached ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'}); check the address and extract.storage_options") from None

    def exists(self) -> bool:
        """Whether a Zarr group exists here (its ``zarr.json``)."""
        if not self.remote:
            return (Path(self.path) / "zarr.json").exists()
        return self._reach(lambda fs, root: fs.exists(f"{root}/zarr.json"))

    def has_content(self) -> bool:
        """Whether anything is stored at this location (a store without its ``zarr.json``,
        or a folder of other files, which creating a store here would delete)."""
        if not self.remote:
            return Path(self.path).is_dir() and any(Path(self.path).iterdir())
        return self._reach(lambda fs, root: fs.exists(root) and bool(fs.ls(root)))

    def open(self, mode: str) -> zarr.Group:
        """The group at this location (``mode`` as :func:`zarr.open_group`'s). A plain path
        and a ``file://`` URL without storage options (and not a chained one) open through
        zarr's ``LocalStore``, which writes each file atomically (a temporary file renamed);
        fsspec's local file system, which a ``file://`` URL with options gets, writes in
        place, so a killed extract could leave a chunk file or a ``zarr.json`` cut short."""
        if not self.remote:
            return zarr.open_group(self.path, mode=mode, use_consolidated=False)
        if str(self.path).startswith("file://") and "::" not in str(self.path) and not self.storage_options:
            return zarr.open_group(self._fs()[1], mode=mode, use_consolidated=False)
        return zarr.open_group(str(self.path), mode=mode, storage_options=self._options(), use_consolidated=False)

    def remove(self) -> None:
        """Delete the store and everything in it."""
        if not self.remote:
            shutil.rmtree(self.path)
            return
        fs, root = self._fs()
        fs.rm(root, recursive=True)

    def sibling(self, suffix: str) -> str | Path:
        """The address of ``<store><suffix>`` beside the store (its lock file)."""
        if self.remote:
            return f"{str(self.path).rstrip('/')}{suffix}"
        p = Path(self.path)
        return p.with_name(p.name + suffix)

    def read_text(self, path: str | Path) -> str | None:
        """The text of a small file beside the store (None when absent); bytes that are not
        UTF-8 are replaced, so a garbled lock file reads as a record nobody wrote."""
        if not self.remote:
            p = Path(path)
            return p.read_bytes().decode(errors="replace") if p.exists() else None
        fs, _ = self._fs()
        target = fsspec_path(path)
        return fs.cat_file(target).decode(errors="replace") if fs.exists(target) else None

    def write_text(self, path: str | Path, text: str) -> None:
        if not self.remote:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
            return
        fs, _ = self._fs()
        fs.pipe_file(fsspec_path(path), text.encode())

    def delete_file(self, path: str | Path) -> None:
        if not self.remote:
            Path(path).unlink(missing_ok=True)
            return
        fs, _ = self._fs()
        target = fsspec_path(path)
        if fs.exists(target):
            fs.rm_file(target)


def local_path(path: str | Path) -> Path | None:
    """The local file-system path of ``path``: itself when it is a path, the path part of a
    ``file://`` URL (the same folder, so both spellings share one lock), None for any other
    URL (``local://`` is ``file://``: :func:`check_address`)."""
    path = check_address(path, "store address")
    if not is_url(path):
        return Path(path)
    if str(path).startswith("file://"):
        return Path(fsspec_path(path))
    return None


def fsspec_path(url: str | Path) -> str:
    """The filesystem path part of an fsspec URL (``memory://a/b`` -> ``/a/b``)."""
    import fsspec

    return fsspec.core.url_to_fs(str(url))[1]
