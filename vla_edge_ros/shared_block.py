# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Named shared-memory blocks for handing data between the processes of one vla_edge (DESIGN.md §3).

A block is a file in ``/dev/shm`` (``VLA_EDGE_SHM_DIR`` when set; the temp dir where neither exists), mapped with
``mmap``.  What makes it safe on a shared, possibly hostile or full ``/dev/shm``:

* **Names nobody can predict or pre-empt**: ``<prefix><16 random hex digits>`` (``secrets``, not a PID), created
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600; a name that exists already (whoever made it) is never
  touched: another random name is tried.
* **Space reserved before mapping**: ``posix_fallocate`` takes the block's pages up front, so a full filesystem is
  one ``SharedBlockError`` ("no room in /dev/shm for a 74 KB frame buffer (12 KB free): ..."), never a SIGBUS on
  the first write to a page the tmpfs cannot supply.
* **Liveness by a lock, not a PID**: the creator holds an exclusive ``flock`` on the block's file for the block's
  life (``remove_block`` unlinks the file, then lets go).  Stale-file clean-up (each ``create_block``) removes only
  files with the prefix, in the new name format, regular, owned by this user with mode 0600, whose ``flock`` it can
  take without waiting, and that are not empty and young (the moment between a creator's ``open`` and its
  ``flock``).  A live instance in another PID namespace (containers sharing ``/dev/shm`` through ``--ipc=host``)
  holds its lock, so its files stay; a killed one's lock went with it, so its files go.
* **Checked on open**: ``open_block`` (the other process's side) refuses, in one line, a file that is not a
  regular file owned by this user with no group/other access.

Python's ``multiprocessing.shared_memory`` is not used: its resource tracker also claims a block that another
process merely opens, and warns or removes it behind the creator's back.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import secrets
import stat
import tempfile
import time

SHM_DIR_VAR = "VLA_EDGE_SHM_DIR"
_NAME_HEX = 16  # random hex digits after the prefix
_CREATE_ATTEMPTS = 32
# An unlocked empty file this young may be a creator between its open() and its flock(): clean-up leaves it.
_EMPTY_GRACE_S = 60.0

_held: dict[str, int] = {}  # path -> fd holding the creator's flock, for each block this process created


class SharedBlockError(RuntimeError):
    """A shared block cannot be created or opened (no room, a bad directory, a file that is not ours): one line."""


def shm_dir() -> str:
    """Where blocks go: ``$VLA_EDGE_SHM_DIR``, else ``/dev/shm``, else the temp dir."""
    configured = os.environ.get(SHM_DIR_VAR)
    if configured:
        return configured
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged user can still allocate in ``directory``'s filesystem (-1 when unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def kb(n: int) -> str:
    return f"{(n + 999) // 1000} KB"


def no_room_message(directory: str, what: str, size: int | None, movable: bool = True) -> str:
    """One line for ENOSPC; ``movable``: whether VLA_EDGE_SHM_DIR would move it (a POSIX semaphore stays in
    /dev/shm)."""
    free = free_bytes(directory)
    free_s = f" ({kb(free)} free)" if free >= 0 else ""
    need = f"a {kb(size)} {what}" if size else what
    if not movable:
        fix = "free space there"
    elif directory == "/dev/shm" and not os.environ.get(SHM_DIR_VAR):
        fix = f"free space or set {SHM_DIR_VAR}"
    elif os.environ.get(SHM_DIR_VAR):
        fix = f"free space there or set {SHM_DIR_VAR} to a directory with room"
    else:
        fix = "free space there"
    return f"no room in {directory} for {need}{free_s}: {fix}"


def _name(prefix: str) -> str:
    return prefix + secrets.token_hex(_NAME_HEX // 2)


# A seam for tests only: the next name to try (a test makes it return a name that exists already first).
_new_name = _name


def _ours(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix) + f"[0-9a-f]{{{_NAME_HEX}}}")


def remove_stale_blocks(prefix: str, directory: str | None = None) -> list[str]:
    """Remove the blocks ``<prefix><hex>`` of this user whose creator is gone (their flock is free); return their
    paths.  Anything else (another user's file, a live instance's, a name not in our format) is left alone."""
    directory = directory or shm_dir()
    pattern = _ours(prefix)
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        path = os.path.join(directory, entry.name)
        try:
            st = os.lstat(path)
            if not _could_be_ours(st):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not _could_be_ours(st):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its creator holds the lock: alive, whatever PID namespace it runs in
            if st.st_size == 0 and time.time() - st.st_mtime < _EMPTY_GRACE_S:
                continue  # a creator between open() and flock()
            try:
                same = os.lstat(path)
                if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed


def _could_be_ours(st: os.stat_result) -> bool:
    """A regular file of this user with no group/other access: what create_block makes."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def create_block(prefix: str, size: int, what: str = "shared block") -> tuple[str, mmap.mmap]:
    """A new zero-filled block of ``size`` bytes: (path, mapping), its space reserved and its flock held until
    ``remove_block``.  Raises ``SharedBlockError`` (one line) when it cannot be made."""
    directory = shm_dir()
    if not os.path.isdir(directory):
        raise SharedBlockError(f"{SHM_DIR_VAR}={directory} is not a directory")
    remove_stale_blocks(prefix, directory)
    for _ in range(_CREATE_ATTEMPTS):
        path = os.path.join(directory, _new_name(prefix))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue  # someone's file (pre-created or not): never ours to touch, take another name
        except OSError as e:
            raise SharedBlockError(_os_error_line(e, directory, what, size)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file nobody else has opened: never waits
            os.fchmod(fd, 0o600)  # whatever the umask
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, size)  # a filesystem without fallocate (not a tmpfs): its own behaviour
            mapping = mmap.mmap(fd, size)
        except BaseException as e:
            _unlink(path)
            os.close(fd)
            if isinstance(e, OSError):
                raise SharedBlockError(_os_error_line(e, directory, what, size)) from None
            raise
        _held[path] = fd
        return path, mapping
    raise SharedBlockError(f"cannot create a {what} in {directory}: {_CREATE_ATTEMPTS} random names were all taken")


def open_block(path: str, size: int) -> mmap.mmap:
    """Map an existing block (created by another process of this user) of at least ``size`` bytes."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SharedBlockError(f"cannot open shared block {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SharedBlockError(f"shared block {path} is not a regular file: refused")
        if st.st_uid != os.geteuid():
            raise SharedBlockError(f"shared block {path} is owned by uid {st.st_uid}, not this user "
                                   f"(uid {os.geteuid()}): refused")
        if st.st_mode & 0o077:
            raise SharedBlockError(f"shared block {path} has mode {stat.S_IMODE(st.st_mode):04o} (group/other "
                                   "access): refused")
        if st.st_size < size:
            raise SharedBlockError(f"shared block {path} has {st.st_size} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def remove_block(path: str) -> None:
    """Remove a block this process created (unlink first, then let go of its lock: never an unlocked file)."""
    _unlink(path)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _os_error_line(e: OSError, directory: str, what: str, size: int) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return no_room_message(directory, what, size)
    return f"cannot create a {kb(size)} {what} in {directory}: {e.strerror or e}"
