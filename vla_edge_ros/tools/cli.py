# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Command-line helpers shared by the tools: checked option types and one-line input checks.

Every tool reports a bad option or input with one line on stderr and a non-zero exit status, never a
traceback: argparse types raise ``ArgumentTypeError`` (argparse prints usage + one line, exit 2), the
``check_*`` functions return a message or None. Results are written atomically with
``output_dir.atomic_output_dir`` (a temporary folder beside ``--out`` that replaces it only when
everything was written), which make_model, quantize and the bench share.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line (``prog: message (see --help)``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


# Every number option is bounded, so that no huge or tiny finite value overflows later (a float that becomes inf
# in a product, a timeout that is too long for the OS, an int that does not fit a C int). The defaults below
# bound every tool's options; `bounded` gives an option its own tighter range.
MAX_NUMBER = 1e9  # a duration of 31 years in seconds, 11 days in ms: nothing a tool means is larger
MIN_POSITIVE = 1e-6  # a rate, factor or duration smaller than this is a typo (and 1/x would be huge)
MAX_INT = (1 << 31) - 1  # fits the C int (scheduler priorities, OpenCV sizes) that the value may end up in


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None


def bounded(lo: float, hi: float, kind=float):
    """Return an argparse type: a finite `kind` (float or int) in [lo, hi], else one line saying the range."""
    def parse(text: str):
        v = _integer(text) if kind is int else _number(text)
        if not (math.isfinite(v) and lo <= v <= hi):
            ends = (f"{int(lo)} to {int(hi)}" if kind is int else f"{lo:g} to {hi:g}")
            raise argparse.ArgumentTypeError(f"must be a{'n integer' if kind is int else ' number'} from {ends}, "
                                             f"not {text[:40]}")
        return v
    parse.__name__ = f"{kind.__name__} in [{lo:g}, {hi:g}]"
    return parse


def finite_positive(text: str) -> float:
    """Parse an option (argparse type): a finite float > 0, in [MIN_POSITIVE, MAX_NUMBER]."""
    v = _number(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text[:40]}")
    if not MIN_POSITIVE <= v <= MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"must be from {MIN_POSITIVE:g} to {MAX_NUMBER:g}, not {text[:40]}")
    return v


def finite_non_negative(text: str) -> float:
    """Parse an option (argparse type): a finite float >= 0, at most MAX_NUMBER."""
    v = _number(text)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text[:40]}")
    if v > MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NUMBER:g}, not {text[:40]}")
    return v


def positive_int(text: str) -> int:
    """Parse an option (argparse type): an integer from 1 to MAX_INT."""
    v = _integer(text)
    if not 1 <= v <= MAX_INT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_INT}, not {text[:40]}")
    return v


def non_negative_int(text: str) -> int:
    """Parse an option (argparse type): an integer from 0 to MAX_INT."""
    v = _integer(text)
    if not 0 <= v <= MAX_INT:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_INT}, not {text[:40]}")
    return v


def fail(tool: str, message: str, rc: int = 2) -> int:
    """Print ``tool: message`` (first line only) to stderr and return ``rc`` for ``sys.exit``."""
    print(f"{tool}: {str(message).strip().splitlines()[0] if str(message).strip() else 'error'}", file=sys.stderr)
    return rc


def check_source(spec: str) -> str | None:
    """Why `spec` cannot be opened as a clip (bag, video, image folder, synthetic), or None."""
    from ..clips import ClipError, open_clip

    try:
        open_clip(spec)
    except ClipError as e:
        return str(e)
    except OSError as e:
        return f"{spec}: {e.strerror or e}"
    return None


def check_out_dir(path: str, force: bool = False) -> str | None:
    """Why `path` cannot take a tool's output folder: a file, a non-empty folder without --force, unwritable."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        return f"--out {path}: is a file, not a folder"
    if p.is_dir() and any(p.iterdir()) and not force:
        return f"--out {path}: folder is not empty (use --force to replace its contents)"
    parent = (p if p.exists() else p.parent).resolve()
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        return f"--out {path}: {parent} is not writable"
    return None


# --- options generated from the settings table -----------------------------------------------------------

def _setting_type(spec):
    """The argparse type of one settings.Spec: the table's range, length and length-in-characters rules."""
    from ..settings import check_specs

    d = spec.default
    if isinstance(d, list):
        kind = int if d and isinstance(d[0], int) else str if d and isinstance(d[0], str) else float

        def parse_list(text: str):
            parts = [x.strip() for x in text.strip().strip("[]").split(",") if x.strip()]
            try:
                v = [kind(x) for x in parts]
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected {spec.length or ''} comma-separated "
                                                 f"{ {int: 'integers', str: 'names'}.get(kind, 'numbers')}, "
                                                 f"not {text[:60]!r}") from None
            problems = check_specs({spec.name: v}, [spec])
            if problems:
                raise argparse.ArgumentTypeError(problems[0])
            return v
        parse_list.__name__ = f"list of {spec.length} {kind.__name__}"
        return parse_list
    if isinstance(d, bool):
        raise TypeError(f"{spec.name}: a boolean setting is not a tool option")
    if isinstance(d, (int, float)):
        return bounded(spec.lo, spec.hi, int if isinstance(d, int) else float)

    def parse_text(text: str):
        problems = check_specs({spec.name: text}, [spec])
        if problems:
            raise argparse.ArgumentTypeError(problems[0])
        return text
    return parse_text


def _shown(v) -> str:
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, list) else \
        (f"{v:g}" if isinstance(v, float) else str(v) if v != "" else "none")


def add_setting_options(parser, names, flags: dict | None = None, defaults: dict | None = None,
                        helps: dict | None = None, specs=None) -> None:
    """One option per node setting in `names` (settings.REASONING_SPECS), generated from the table: ``--period-ms``
    for ``period_ms`` (`flags` renames one), stored under the setting's own name, the table's range, choices and
    length checked, its description as the help. The default is the node's unless `defaults` gives the tool's own
    (then `helps` says why, in the help's ``(default: ...)``). `specs`: another table (settings.CAMERA_SPECS)."""
    from ..settings import REASONING_SPECS, spec_table

    table, flags, defaults, helps = spec_table(specs or REASONING_SPECS), flags or {}, defaults or {}, helps or {}
    for name in names:
        spec = table[name]
        default = defaults.get(name, list(spec.default) if isinstance(spec.default, list) else spec.default)
        text = f"{spec.description} (default: {helps.get(name) or _shown(default)}; the node's {name})"
        kwargs = dict(dest=name, default=default, help=text.replace("%", "%%"))
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        else:
            kwargs["type"] = _setting_type(spec)
            if isinstance(spec.default, list):
                kwargs["metavar"] = ",".join(["X"] * (spec.length or 1))
        parser.add_argument(flags.get(name, "--" + name.replace("_", "-")), **kwargs)


def setting_values(args, names) -> dict:
    """The settings `add_setting_options` added, as {name: value} for settings.ReasoningSettings.from_values."""
    return {name: getattr(args, name) for name in names}
