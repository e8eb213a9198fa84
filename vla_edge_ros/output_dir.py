"""Output folders of the tools (models, reports): written whole or not at all.

`atomic_output_dir` hands out a temporary folder beside the target and renames it into place when the writer is
done, so a reader never sees half a model or half a report, and an interrupted run leaves the old contents.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager


class OutputDirError(Exception):
    """An output directory a tool must not write: a file, or a directory with contents and no --force."""


def check_output_dir(out, force: bool = False) -> None:
    out = str(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputDirError(f"--out {out} is a file, not a directory")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise OutputDirError(f"--out {out} is not empty (choose a new directory, or --force to replace it)")


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextmanager
def atomic_output_dir(out, force: bool = False):
    """Yield a temporary directory beside `out`; on success it becomes `out` by rename, so `out` is either the
    old contents or the complete new ones, never a mix. An empty `out` is replaced; a non-empty one only with
    `force` (then removed after the new one is in place). On failure the temporary directory is removed."""
    out = os.path.abspath(str(out))
    check_output_dir(out, force)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    old = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary directory
        yield tmp
        check_output_dir(out, force)  # again: something may have written there meanwhile
        if os.path.isdir(out):
            if os.listdir(out):
                old = tmp + ".old"
                os.rename(out, old)
            else:
                os.rmdir(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
