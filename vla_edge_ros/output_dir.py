# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Output folders of the tools (models, reports): written whole or not at all.

`atomic_output_dir` hands out a temporary folder beside the target and renames it into place when the writer is
done, so a reader never sees half a model or half a report, and an interrupted run leaves the old contents.

A temporary folder is ``.<out>.<random>.vla-out.tmp``; beside it, ``<that name>.lock`` is a lock file on which its
creator holds an ``fcntl.flock`` for as long as it works.  A run killed outright (kill -9, power loss) cannot clean
up; the next `atomic_output_dir` in the same parent folder removes every temporary folder whose lock it can take
(its creator is gone: the kernel drops a flock with the process) and never one whose lock is held.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
import tempfile
from contextlib import contextmanager

TMP_MARKER = ".vla-out.tmp"  # the end of a temporary folder's name
LOCK_SUFFIX = ".lock"  # its lock file: the folder's name + this
OLD_SUFFIX = ".old"  # the replaced contents of a non-empty --out (with --force), until the new ones are in place
_NEW_LOCK_SUFFIX = ".lock-new"  # a lock file before it is locked (never looked at by the cleanup)
_RANDOM_HEX = 16


class OutputDirError(Exception):
    """An output directory a tool must not write: a file, or a directory with contents and no --force."""


def check_output_dir(out, force: bool = False) -> None:
    out = str(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputDirError(f"--out {out} is a file, not a directory")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise OutputDirError(f"--out {out} is not empty (choose a new directory, or --force to replace it)")


def _rmtree(path: str) -> None:
    """Remove a folder (never what a symbolic link points to)."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _target_of(stem: str) -> str | None:
    """The --out a temporary folder ``<parent>/.<out>.<random><TMP_MARKER>`` was made for."""
    parent, name = os.path.split(stem)
    base, dot, rnd = name[1:-len(TMP_MARKER)].rpartition(".")
    if not (name.startswith(".") and dot and base and len(rnd) == _RANDOM_HEX):
        return None
    return os.path.join(parent, base)


def clean_dead_temp_dirs(parent) -> list[str]:
    """Remove the temporary folders in `parent` whose creator is provably gone: the flock on their lock file can
    be taken.  Only lock files of this user, by name, as regular files.  Should a dead run have been killed
    between moving the old contents of its --out aside and putting the new ones in place, the old contents go
    back to --out.  Returns the paths removed."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(".") and name.endswith(TMP_MARKER + LOCK_SUFFIX)):
            continue
        lock = os.path.join(parent, name)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue  # gone meanwhile, not ours, a link
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue  # held: its creator is alive
                raise
            try:  # still the file of that name (another cleanup may have removed it and a new run made one)
                now = os.stat(lock, follow_symlinks=False)
            except OSError:
                continue
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue
            stem = lock[:-len(LOCK_SUFFIX)]
            target = _target_of(stem)
            old = stem + OLD_SUFFIX
            if target and os.path.isdir(old) and not os.path.islink(old) and not os.path.lexists(target):
                try:
                    os.rename(old, target)  # killed mid-swap: the old contents, complete, go back
                except OSError:
                    pass
            for d in (stem, old):
                if os.path.lexists(d):
                    _rmtree(d)
                    removed.append(d)
            os.unlink(lock)
            removed.append(lock)
        except OSError:
            continue  # a folder we cannot remove stays; the tool's own work goes on
        finally:
            os.close(fd)
    return removed


def _new_locked_stem(parent: str, base: str) -> tuple[str, int]:
    """A fresh temporary folder name in `parent` and the fd of its lock file, already locked.

    The lock file is created under a name the cleanup never looks at, locked, and only then renamed to the
    name it does look at: a cleanup can never find it unlocked while its creator lives."""
    for _ in range(100):
        stem = os.path.join(parent, f".{base}.{secrets.token_hex(_RANDOM_HEX // 2)}{TMP_MARKER}")
        if os.path.lexists(stem) or os.path.lexists(stem + LOCK_SUFFIX):
            continue
        try:
            fd = os.open(stem + _NEW_LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(stem + _NEW_LOCK_SUFFIX, stem + LOCK_SUFFIX)
        except BaseException:
            try:
                os.unlink(stem + _NEW_LOCK_SUFFIX)
            except OSError:
                pass
            os.close(fd)
            raise
        return stem, fd
    raise OutputDirError(f"cannot make a temporary folder in {parent}")


@contextmanager
def atomic_output_dir(out, force: bool = False):
    """Yield a temporary directory beside `out`; on success it becomes `out` by rename, so `out` is either the
    old contents or the complete new ones, never a mix. An empty `out` is replaced; a non-empty one only with
    `force` (then removed after the new one is in place). On failure (an exception, Ctrl-C) the temporary
    directory is removed; after a kill -9 the next call for the same parent folder removes it."""
    out = os.path.abspath(str(out))
    check_output_dir(out, force)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    clean_dead_temp_dirs(parent)
    stem, lock_fd = _new_locked_stem(parent, os.path.basename(out))
    tmp, old = stem, None
    try:
        os.mkdir(tmp)  # an ordinary directory (0777 less the umask), as the result will be
        yield tmp
        check_output_dir(out, force)  # again: something may have written there meanwhile
        if os.path.isdir(out):
            if os.listdir(out):
                old = stem + OLD_SUFFIX
                os.rename(out, old)
            else:
                os.rmdir(out)
        os.rename(tmp, out)
    finally:
        try:
            if old is not None and not os.path.lexists(out):
                _quietly(os.rename, old, out)  # interrupted mid-swap: the old contents stay
            if os.path.lexists(tmp):
                _rmtree(tmp)
            if old is not None and os.path.lexists(old):
                _rmtree(old)
            _quietly(os.unlink, stem + LOCK_SUFFIX)
        finally:
            os.close(lock_fd)  # the lock goes last: until here a cleanup leaves everything of ours alone


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


@contextmanager
def atomic_file(path):
    """A temporary file beside `path` to write (yields its name), fsynced and renamed over `path` when the block
    ends, removed when it raises: a reader sees the old file or the new one, never half of one."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _quietly(os.unlink, tmp)
        raise


def write_json_atomic(path, data) -> None:
    """`data` as indented JSON at `path`, whole or not at all (`atomic_file`)."""
    with atomic_file(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=1)
