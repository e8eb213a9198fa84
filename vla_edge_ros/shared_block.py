"""Named shared-memory blocks for handing data between the processes of one vla_edge (DESIGN.md §3).

A block is a file in ``/dev/shm`` (the temp dir where that does not exist) named ``<prefix><pid>_<n>`` after the
process that created it, mapped with ``mmap``.  The creator removes it when done; a block whose creator was
killed first is removed by the next ``create_block`` with the same prefix on the machine, so nothing
accumulates.  Python's ``multiprocessing.shared_memory`` is not used: its resource tracker also claims a block
that another process merely opens, and warns or removes it behind the creator's back.
"""

from __future__ import annotations

import itertools
import mmap
import os
import tempfile

_created = itertools.count()


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def remove_stale_blocks(prefix: str, directory: str | None = None) -> list[str]:
    """Remove the blocks named ``<prefix><pid>_*`` whose process no longer exists; return their paths."""
    directory = directory or shm_dir()
    removed = []
    for name in os.listdir(directory):
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix):].split("_")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
            except OSError:
                pass
        except (ValueError, PermissionError):
            pass  # not one of ours, or another user's live process
    return removed


def create_block(prefix: str, size: int) -> tuple[str, mmap.mmap]:
    """A new zero-filled block of ``size`` bytes: (path, mapping)."""
    directory = shm_dir()
    remove_stale_blocks(prefix, directory)
    path = os.path.join(directory, f"{prefix}{os.getpid()}_{next(_created)}")
    return path, _map(path, size, create=True)


def open_block(path: str, size: int) -> mmap.mmap:
    """Map an existing block (created by another process) of at least ``size`` bytes."""
    return _map(path, size, create=False)


def remove_block(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _map(path: str, size: int, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        elif os.fstat(fd).st_size < size:
            raise RuntimeError(f"shared block {path} has {os.fstat(fd).st_size} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
