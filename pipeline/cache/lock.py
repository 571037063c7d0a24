"""One writer at a time: the lock an extract holds on its store.

    with store_lock("cache/features/toy.zarr"):
        ...                                  # open_for_writing, encode, finish

The lock is the file ``<store>.lock`` beside the store (the store folder itself may not exist
yet). Its holder takes an exclusive ``flock`` on it and writes its pid, host and start time
into it, so a second extract into the same store is refused at once with a message naming
the holder. ``flock`` is released by the kernel when its holder dies, so the lock of a killed
extract (``kill -9``) is stale by construction: the next extract reclaims it and resumes,
logging whose lock it took over. A lock file whose host is another machine (a store on a
shared file system) cannot be checked from here; while its ``flock`` is held it is refused
like a local one, and ``break_lock`` takes it over when the file system does not carry
``flock`` across hosts and the holder is known to be gone.

A ``file://`` URL is a local path: its lock is that path's ``flock``ed lock file, so an
extract given the path and one given the URL exclude each other.

A remote store (any other fsspec URL) has no ``flock``: its lock is the object
``<store>.lock`` holding the same record, written when the lock is taken and deleted when it
is released. While it exists the store is refused; a holder that died leaves it behind,
which the message says (stale when its host is this machine and its pid is not running),
and ``break_lock`` takes it over. An object store offers no atomic create here, so two
extracts started within the same moment can both find no lock object and both proceed: the
remote lock refuses a second writer that starts while the first runs, not a simultaneous one.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.cache.schema import CacheError

log = logging.getLogger(__name__)


class StoreLockedError(CacheError):
    """Another process is writing the store."""


def lock_path(store: str | Path) -> Path:
    """``<store>.lock``: the lock file of the store at ``store``."""
    store = Path(store)
    return store.with_name(store.name + ".lock")


def read_holder(store: str | Path) -> dict[str, Any]:
    """The pid, host and start time recorded in the store's lock file ({} when none);
    ``{"unreadable": path}`` when the file holds anything else (not UTF-8, not JSON, or JSON
    that is not a record), so the lock is still described and reclaimable."""
    path = lock_path(store)
    try:
        return parse_holder(path.read_bytes(), str(path))
    except (FileNotFoundError, NotADirectoryError):
        return {}


def parse_holder(data: bytes | str, where: str) -> dict[str, Any]:
    """The holder record in a lock file's contents ``data`` ({} when empty); contents that
    are not a JSON record of a holder give ``{"unreadable": where}``."""
    try:
        holder = json.loads(data or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"unreadable": where}
    return holder if isinstance(holder, dict) else {"unreadable": where}


@contextmanager
def store_lock(store: str | Path, break_lock: bool = False, storage_options: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Hold the write lock of ``store`` for the duration of the block.

    Args:
        break_lock: take the lock over although the lock file names another host whose
            extract may still run (a shared file system without cross-host ``flock``).

    Yields:
        The holder record written into the lock file (pid, host, started).

    Raises:
        StoreLockedError: another live process holds the lock (the message names its pid,
            host and start time), or the lock file names another host and ``break_lock`` is
            False.
    """
    from pipeline.cache.location import local_path

    if local_path(store) is None:
        with _remote_lock(str(store), break_lock, storage_options or {}) as holder:
            yield holder
        return
    store = local_path(store)
    path = lock_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise StoreLockedError(f"{path} is a folder where the store's lock file belongs: remove that folder and rerun")
    if path.is_symlink() and not path.exists():
        raise StoreLockedError(f"{path}, the store's lock file, is a link to {os.readlink(path)}, which cannot be opened: remove the link and rerun")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(
                f"{store} is being written by {describe_holder(read_holder(store))}; wait for that "
                f"extract to finish (its lock is {path})"
            ) from None
        previous = read_holder(store)
        here = _host()
        if previous.get("host") not in (None, here) and not break_lock:
            raise StoreLockedError(
                f"{store} has a lock of {describe_holder(previous)}, another host, which this machine "
                f"cannot check; if that extract is gone, rerun with --break-lock"
            )
        if previous:
            if previous.get("host") not in (None, here):
                log.warning("%s: taking over the lock of %s, another host (--break-lock)", store, describe_holder(previous))
            else:
                log.warning("%s: reclaiming the stale lock of %s (no process holds it: that extract has ended)", store, describe_holder(previous))
        holder = _me()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        os.fsync(fd)
        try:
            yield holder
        finally:
            os.ftruncate(fd, 0)  # an empty lock file: released cleanly
    finally:
        os.close(fd)  # releases the flock


def running_writer(store: str | Path) -> dict[str, Any] | None:
    """The holder of the store's write lock while an extract holds it (None when none does,
    or when the store is remote: its lock object cannot tell a live holder from a dead one).
    A reader uses it to say that rows or indexes it lacks are being written now."""
    from pipeline.cache.location import local_path

    if local_path(store) is None:
        return None
    store = local_path(store)
    path = lock_path(store)
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(store)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextmanager
def _remote_lock(store: str, break_lock: bool, storage_options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from pipeline.cache.location import StoreLocation

    loc = StoreLocation.of(store, storage_options)
    path = loc.sibling(".lock")
    text = loc.read_text(path)
    if text and not break_lock:
        previous = parse_holder(text, path)
        pid = previous.get("pid")
        stale = previous.get("host") == _host() and isinstance(pid, int) and not _alive(pid)
        state = "stale: that process is not running" if stale else "it may still be running"
        raise StoreLockedError(
            f"{store} is locked by {describe_holder(previous)} ({state}); wait for it, or rerun with "
            f"--break-lock once it is gone (lock: {path})"
        )
    holder = _me()
    loc.write_text(path, json.dumps(holder))
    try:
        yield holder
    finally:
        loc.delete_file(path)


def _host() -> str:
    return socket.gethostname()


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": _host(), "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def describe_holder(holder: dict[str, Any]) -> str:
    """A lock holder in words: its pid, host and start time."""
    if not holder:
        return "another process (its lock file names none yet)"
    if "unreadable" in holder:
        return f"an unknown process (its lock file {holder['unreadable']} holds no lock record)"
    since = f" since {holder['started']}" if holder.get("started") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{since}"
