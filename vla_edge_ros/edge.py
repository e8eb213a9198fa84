# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Edge fit as pure arithmetic (no GPU, no ROS): the bytes one chunk must move, phase by phase, and what that
costs on a named board (DESIGN.md §11).

A chunk is bandwidth-bound: every pass reads every layer weight once, plus the KV its attention reads. So its
time on a board is at least ``bytes / bandwidth``; a real engine reaches a fraction of the bandwidth (the
*efficiency*, measured on the GPU the engine ran on), and :func:`project` divides by ``bandwidth x efficiency``.
What is counted (the floor): layer weights at their storage format, the final norm, the 256 action rows of the
head, the KV read and written, the vision projector and the frame. Intermediate activations are not counted
(they are small for decode and assumed to stay in cache for the 32-40 prefill rows).

Bytes are one bound; where the engine was measured with the GPU confined to a board's SM count (chunk_bench
--sms), :func:`compute_bound` gives the other (compute/latency), and vla-edge-plan prints both. Boards and the
engine's measurements come from ``config/boards.yaml`` (installed to the package's share directory, or the
repository's ``config/`` in a source checkout).

The measurements are per model shape (``measured.shapes``: the published Qwen2.5 0.5B, 1.5B and 3B backbones): a
model uses the entry whose geometry (hidden size, layers, heads, FFN) it has, and nothing else. A shape that was not
measured gets byte floors only, and the tools say so; one shape's time is never scaled to another.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .admission import budget_problem
from .constants import (ACTION_TOKENS, ACTION_VOCAB, DEFAULT_PROMPT_TOKENS, FRAME_C, FRAME_H, FRAME_W, GROUP_SIZE,
                        PATCH_DIM, PERIOD_MS, SAFETY_MARGIN_MS, VISION_TOKENS)
from .kv_cache import min_capacity
from .model.config import ACTION_DECODING

_PKG = "vla_edge_ros"
BOARDS_FILE = "boards.yaml"
WEIGHT_FORMATS = ("bf16", "w4")

# What the engine measured (fraction of copy bandwidth per kind; chunk time with the GPU confined to N SMs) is data:
# config/boards.yaml's "measured.shapes" section, one entry per model shape, with its command, machine and date. Kind
# keys: weight format, "-parallel" for parallel action decoding. Where the model's shape has no entry, projections
# are floors at 100 % bandwidth.
FLOOR_NOTE = "floor at 100 % of bandwidth (no measured efficiency): real chunks take longer"
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
PEAK_NOTE = "vendor peak bandwidth: a copy reaches less, so the time is optimistic"


class EdgeError(ValueError):
    """Bad input to the edge arithmetic (unknown board, impossible number): one line for the user."""


# -- bytes per chunk ------------------------------------------------------------------------------


def frame_capacity(capacity: int, prompt_tokens: int, action_tokens: int = ACTION_TOKENS) -> int:
    """Frame blocks a cache of ``capacity`` slots holds (kv_cache.KvCache's layout: prompt, the action slots (8, or
    8 K for a model that plans K actions), then 32-slot blocks)."""
    return (int(capacity) - int(prompt_tokens) - int(action_tokens)) // VISION_TOKENS


def full_cache_keys(capacity: int, prompt_tokens: int, action_tokens: int = ACTION_TOKENS) -> int:
    """Keys the middle decode pass attends with every block in use: prompt + retained frames + the new frame
    + its action slots up to the middle pass (pass i attends i+1 of them; 1 + 8//2 is the mean, rounded up).
    ``action_tokens``: the cache's transient slots (8 K), which take room from the frames."""
    blocks = frame_capacity(capacity, prompt_tokens, action_tokens)
    if blocks < 1:
        raise EdgeError(f"capacity {capacity} holds no frame with a {prompt_tokens}-token prompt "
                        f"(needs at least {min_capacity(prompt_tokens, action_tokens=action_tokens)})")
    return int(prompt_tokens) + blocks * VISION_TOKENS + 1 + ACTION_TOKENS // 2


def _weight_format(cfg, weights):
    """(name, bits, group, zero points?) of the layer weights: from ``weights`` if given, else cfg.quant."""
    quant = getattr(cfg, "quant", None)
    if weights is None:
        weights = "bf16" if quant is None else "w4"
    if weights not in WEIGHT_FORMATS:
        raise EdgeError(f"weights {weights!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "bf16":
        return "bf16", 16, None, False
    bits = int(getattr(quant, "bits", 4) or 4) if quant is not None else 4
    group = int(getattr(quant, "group_size", GROUP_SIZE) or GROUP_SIZE) if quant is not None else GROUP_SIZE
    symmetric = bool(getattr(quant, "symmetric", False)) if quant is not None else False
    return "w4", bits, group, not symmetric


def _matrix_bytes(n_in: int, n_out: int, bits: int, group: int | None, zeros: bool) -> int:
    """Bytes of one [n_out, n_in] projection: bf16, or packed ints + a 16-bit scale (and a zero point of the
    same width as the weights) per ``group`` input channels per output."""
    if group is None:
        return 2 * n_in * n_out
    groups = math.ceil(n_in / group) * n_out
    return math.ceil(n_in * n_out * bits / 8) + 2 * groups + (math.ceil(groups * bits / 8) if zeros else 0)


def layer_weight_bytes(cfg, weights=None) -> int:
    """Bytes every pass reads for the transformer layers: per layer the q/k/v, o, gate/up and down
    projections at their format, two RMSNorm weights (bf16) and the q/k/v biases (fp32, as the engine keeps
    them); plus the final norm."""
    _, bits, group, zeros = _weight_format(cfg, weights)
    H, I, L = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.num_hidden_layers)
    nq = int(cfg.num_attention_heads) * int(cfg.head_dim)
    nkv = int(cfg.num_key_value_heads) * int(cfg.head_dim)
    qkv = nq + 2 * nkv
    mats = (_matrix_bytes(H, qkv, bits, group, zeros) + _matrix_bytes(nq, H, bits, group, zeros)
            + _matrix_bytes(H, 2 * I, bits, group, zeros) + _matrix_bytes(I, H, bits, group, zeros))
    per_layer = mats + 2 * 2 * H + 4 * qkv
    return L * per_layer + 2 * H


def kv_bytes_per_key(cfg) -> int:
    """K and V of one token in every layer, bf16."""
    return int(cfg.num_hidden_layers) * 2 * int(cfg.num_key_value_heads) * int(cfg.head_dim) * 2


def chunk_bytes(cfg, capacity: int, attended_keys: int | None = None, weights: str | None = None,
                decoding: str | None = None, prompt_tokens: int | None = None) -> dict:
    """Bytes one chunk must move, by phase.

    ``attended_keys``: keys the middle decode pass attends (default: a full cache, :func:`full_cache_keys`);
    the frame's context (prompt + retained frames + the new frame) is ``attended_keys - 1 - 8//2``.
    ``weights``: "bf16" | "w4" (default: "w4" when ``cfg.quant`` is set). ``decoding``: "autoregressive" (8
    passes) | "parallel" (no decode pass: the prefill covers 32 vision + 8 K action rows and the head reads its
    256 rows once); default ``cfg.action_decoding``. K: ``cfg.action_chunk`` for parallel decoding (the actions the
    pass plans; its 8 K transient slots also take room from the frames), 1 for autoregressive (a what-if on a K > 1
    model counts one action). ``prompt_tokens``: the pinned prompt's length (default: the engine's
    DEFAULT_PROMPT_TOKENS).
    """
    fmt, bits, group, zeros = _weight_format(cfg, weights)
    decoding = decoding if decoding is not None else getattr(cfg, "action_decoding", "autoregressive")
    if decoding not in ACTION_DECODING:
        raise EdgeError(f"decoding {decoding!r}: choose one of {', '.join(ACTION_DECODING)}")
    if prompt_tokens is None:
        prompt_tokens = DEFAULT_PROMPT_TOKENS
    if int(prompt_tokens) < 0:
        raise EdgeError(f"prompt_tokens {prompt_tokens} must be >= 0")
    chunk = int(getattr(cfg, "action_chunk", 1)) if decoding == "parallel" else 1
    A = ACTION_TOKENS * chunk  # action tokens (and transient slots) of one chunk
    full = full_cache_keys(capacity, prompt_tokens, A)
    if attended_keys is None:
        attended_keys = full
    mid = 1 + ACTION_TOKENS // 2
    least = int(prompt_tokens) + VISION_TOKENS + mid
    if not (least <= int(attended_keys) <= full):
        raise EdgeError(f"attended_keys {attended_keys} must be between {least} (prompt + one frame) and "
                        f"{full} (a full {capacity}-slot cache with a {prompt_tokens}-token prompt)")
    attended_keys = int(attended_keys)
    context = attended_keys - mid  # prompt + retained frames + the new frame

    H = int(cfg.hidden_size)
    layers = layer_weight_bytes(cfg, fmt)
    per_key = kv_bytes_per_key(cfg)
    head = ACTION_VOCAB * H * 2  # the 256 action rows of the (tied) head, bf16
    frame = FRAME_H * FRAME_W * FRAME_C
    vision = 2 * (PATCH_DIM * H + H + VISION_TOKENS * H) + frame + 2 * VISION_TOKENS * H  # projector, frame, out
    if decoding == "autoregressive":
        passes = ACTION_TOKENS
        prefill_rows = VISION_TOKENS
        # reads the context's KV (the frame's own keys included), writes the frame's 32 keys
        prefill = layers + per_key * (context + VISION_TOKENS)
        # one pass: the layers, the head, one embedding row in; attends attended_keys, writes one key
        decode_pass = layers + head + 2 * H + per_key * (attended_keys + 1)
    else:
        passes = 0
        prefill_rows = VISION_TOKENS + A
        # 32 + 8 K rows: attends context + the 8 K action queries, writes 32 + 8 K keys; 8 K action-slot embeddings
        # in; head once
        prefill = (layers + per_key * (context + A + prefill_rows) + 2 * A * H + head)
        decode_pass = 0
    total = vision + prefill + passes * decode_pass
    return {
        "weights": fmt, "bits": bits, "group_size": group, "zero_points": zeros, "decoding": decoding,
        "action_chunk": chunk,
        "capacity": int(capacity), "prompt_tokens": int(prompt_tokens), "attended_keys": attended_keys,
        "prefill_rows": prefill_rows, "layer_weight_bytes": layers, "kv_bytes_per_key": per_key,
        "head_bytes": head, "vision": vision, "prefill": prefill, "decode_pass": decode_pass,
        "decode_passes": passes, "decode": passes * decode_pass, "total": total,
    }


# -- boards ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Board:
    name: str
    bandwidth_gbps: float  # vendor peak
    memory_gb: float
    shared_memory: bool = False
    copy_gbps: float | None = None  # measured copy rate, where known
    source: str = ""
    aliases: tuple[str, ...] = ()
    sms: int | None = None  # GPU multiprocessors
    gpu_clock_mhz: float | None = None  # highest documented GPU clock
    tensor_rate_vs_hopper: float | None = None  # dense bf16 tensor FLOP / SM / clock relative to an H100/H200 SM
    compute_source: str = ""

    @property
    def effective_gbps(self) -> float:
        """The bandwidth the efficiency applies to: measured copy where known, else the vendor peak."""
        return self.copy_gbps if self.copy_gbps else self.bandwidth_gbps


def boards_path() -> str:
    """config/boards.yaml: the installed share directory (through ament_index) or the source tree's config/."""
    env = os.environ.get("VLA_EDGE_BOARDS_FILE")
    if env:
        return env
    try:
        from ament_index_python.packages import get_package_share_directory

        p = os.path.join(get_package_share_directory(_PKG), "config", BOARDS_FILE)
        if os.path.isfile(p):
            return p
    except Exception:  # noqa: BLE001 - no ROS / package not installed: fall back to the source tree
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "config", BOARDS_FILE)


def _positive(name, key, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise EdgeError(f"board {name!r}: {key} must be a positive number, got {v!r}")
    return float(v)


def load_boards(path: str | None = None) -> dict[str, Board]:
    """All boards of the data file, by name (in file order)."""
    import yaml

    path = path or boards_path()
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise EdgeError(f"{path}: cannot read the board list ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("boards"), dict) or not raw["boards"]:
        raise EdgeError(f"{path}: expected a mapping 'boards:' of board names")
    boards = {}
    for name, b in raw["boards"].items():
        name = str(name)
        if not isinstance(b, dict):
            raise EdgeError(f"{path}: board {name!r} is not a mapping")
        copy = b.get("copy_gbps")
        opt = {k: _positive(name, k, b[k]) for k in ("sms", "gpu_clock_mhz", "tensor_rate_vs_hopper")
               if b.get(k) is not None}
        if "sms" in opt:
            opt["sms"] = int(opt["sms"])
        boards[name] = Board(name=name, bandwidth_gbps=_positive(name, "bandwidth_gbps", b.get("bandwidth_gbps")),
                             memory_gb=_positive(name, "memory_gb", b.get("memory_gb")),
                             shared_memory=bool(b.get("shared_memory", False)),
                             copy_gbps=None if copy is None else _positive(name, "copy_gbps", copy),
                             source=str(b.get("source", "")),
                             aliases=tuple(str(a) for a in (b.get("aliases") or ())),
                             compute_source=str(b.get("compute_source", "")), **opt)
    return boards


def load_measured(path: str | None = None) -> dict:
    """The data file's "measured" section ({} when it has none or cannot be read)."""
    import yaml

    try:
        with open(path or boards_path(), encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    m = raw.get("measured") if isinstance(raw, dict) else None
    return m if isinstance(m, dict) else {}


def measured_shapes(measured: dict | None = None) -> dict[str, dict]:
    """The measured shapes by name (config/boards.yaml measured.shapes): each {shape: {...}, efficiency: {kind: f},
    whole_gpu_chunk_ms: {kind: ms}, sm_confined: {clock_mhz, chunk_ms: {kind: {N: ms}}}, device, source}."""
    m = load_measured() if measured is None else measured
    shapes = m.get("shapes") if isinstance(m, dict) else None
    return {str(k): v for k, v in shapes.items() if isinstance(v, dict)} if isinstance(shapes, dict) else {}


def measured_device(entry: dict | None) -> str:
    """The card a measured shape's entry names (boards.yaml measured.shapes.<shape>.device); "unnamed GPU" if none."""
    d = (entry or {}).get("device")
    return str(d) if d else "unnamed GPU"


def shape_of(cfg) -> dict:
    """The geometry a measurement is keyed by (what the chunk's time depends on; the vocabulary size does not enter:
    the chunk reads 256 head rows)."""
    return {k: int(getattr(cfg, k)) for k in SHAPE_KEYS if getattr(cfg, k, None) is not None}


def measured_for(cfg, measured: dict | None = None) -> tuple[str | None, dict | None]:
    """(name, entry) of the measured shape that is the model's own (every SHAPE_KEYS value equal), else (None, None)."""
    if cfg is None:
        return None, None
    mine = shape_of(cfg)
    for name, entry in measured_shapes(measured).items():
        shape = entry.get("shape") or {}
        if shape and all(mine.get(k) == int(v) for k, v in shape.items()):
            return name, entry
    return None, None


def measured_efficiency(kind: str, cfg, measured: dict | None = None) -> tuple[float | None, str | None]:
    """(fraction of copy bandwidth the engine reached for this kind on the model's own shape, that shape's name);
    (None, None) when the shape or the kind was not measured."""
    name, entry = measured_for(cfg, measured)
    v = ((entry or {}).get("efficiency") or {}).get(kind)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1:
        return float(v), name
    return None, None


def compute_bound(kind: str, board: Board, measured: dict | None = None, cfg=None) -> dict | None:
    """The chunk time the board's SMs allow (compute/latency bound), from the chunk of the model's own shape measured
    on a Hopper card (the entry's ``device``) confined to N SMs (boards.yaml measured.shapes.<shape>.sm_confined):
    t_N x (N / board SMs) x (measured clock / board clock) / (board tensor rate per SM per clock relative to Hopper),
    N the measured count nearest the board's (within 2x). ``measured``: the whole measured section (the entry is
    found by ``cfg``'s shape) or one shape's entry. None when the shape or kind was not measured that way, no count
    is within 2x of the board's, or the board lacks sms / gpu_clock_mhz / tensor_rate_vs_hopper."""
    m = load_measured() if measured is None else measured
    if "sm_confined" in m:  # one shape's entry
        entry, name = m, m.get("name")
        shape = entry.get("shape") or {}
        if cfg is not None and any(getattr(cfg, k, None) != v for k, v in shape.items()):
            return None
    else:
        name, entry = measured_for(cfg, m)
    conf = (entry or {}).get("sm_confined") or {}
    runs = (conf.get("chunk_ms") or {}).get(kind)
    clock = conf.get("clock_mhz")
    if not runs or not clock or not (board.sms and board.gpu_clock_mhz and board.tensor_rate_vs_hopper):
        return None
    n = min(runs, key=lambda k: (abs(int(k) - board.sms), -int(k)))
    if not 0.5 <= board.sms / int(n) <= 2:  # a chunk is not linear in SMs far from the measured count (the chain)
        return None
    ms = float(runs[n]) * (int(n) / board.sms) * (float(clock) / board.gpu_clock_mhz) / board.tensor_rate_vs_hopper
    where = f"{name} " if name else ""
    return {"chunk_ms": ms, "measured_sms": int(n), "measured_ms": float(runs[n]), "shape": name,
            "basis": f"{where}{kind} measured on {n} SMs of an {measured_device(entry)} at {clock:g} MHz: "
                     f"{float(runs[n]):.2f} ms, scaled to "
                     f"{board.sms} SMs at {board.gpu_clock_mhz:g} MHz x {board.tensor_rate_vs_hopper:g} Hopper's "
                     f"tensor rate per SM per clock"}


def find_board(name: str, boards: dict[str, Board] | None = None) -> Board:
    """A board by name or alias (case-insensitive); EdgeError listing the known names otherwise."""
    boards = boards if boards is not None else load_boards()
    key = str(name).strip().lower()
    for b in boards.values():
        if key == b.name.lower() or key in (a.lower() for a in b.aliases):
            return b
    raise EdgeError(f"unknown board {name!r}; known: {', '.join(boards)}")


# -- projection -----------------------------------------------------------------------------------


def efficiency_from_measurement(chunk_bytes_total: float, chunk_ms: float, copy_gbps: float) -> float:
    """Fraction of copy bandwidth a measured chunk reached: (bytes / time) / copy bandwidth."""
    if not (chunk_ms > 0 and copy_gbps > 0):
        raise EdgeError(f"need chunk_ms > 0 and copy_gbps > 0, got {chunk_ms}, {copy_gbps}")
    return chunk_bytes_total / (chunk_ms * 1e-3) / (copy_gbps * 1e9)


def chunk_kind(bytes_by_phase: dict) -> str:
    """The measurement key of a chunk: weight format, + "-parallel" for parallel action decoding, + "-k<K>" for a
    parallel chunk of K > 1 actions (its own measurement: another K's time is never used for it)."""
    k = int(bytes_by_phase.get("action_chunk", 1))
    return (bytes_by_phase.get("weights", "") + ("-parallel" if bytes_by_phase.get("decoding") == "parallel" else "")
            + (f"-k{k}" if k > 1 else ""))


def project(bytes_by_phase: dict, board: Board, efficiency: float | None = None, period_ms: float = PERIOD_MS,
            safety_margin_ms: float = SAFETY_MARGIN_MS, cfg=None, measured: dict | None = None) -> dict:
    """Projected time per phase and chunk on ``board``: bytes / (board bandwidth x efficiency).

    ``efficiency`` (0 < e <= 1): the fraction of copy bandwidth the engine reached on the GPU it was measured
    on. None: the efficiency measured for the chunk's kind on the model's own shape (``cfg``: measured.shapes in
    boards.yaml), else 1.0 and the result says it is a floor (no other shape's number is used).
    The verdict compares the chunk with ``period_ms - safety_margin_ms``.
    """
    basis, shape = "given", None
    if efficiency is None:
        efficiency, shape = measured_efficiency(chunk_kind(bytes_by_phase), cfg, measured)
        basis = "measured"
    if efficiency is None:
        efficiency, basis = 1.0, "floor"
    for key, v in (("efficiency", efficiency), ("period_ms", period_ms), ("safety_margin_ms", safety_margin_ms)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise EdgeError(f"{key} must be a finite number, got {v!r}")
    if not (0 < efficiency <= 1):
        raise EdgeError(f"efficiency {efficiency} must be in (0, 1]: a fraction of the copy bandwidth")
    problem = budget_problem(period_ms, safety_margin_ms)
    if problem:
        raise EdgeError(problem)
    rate = board.effective_gbps * 1e9 * efficiency  # bytes per second

    def ms(b):
        return b * 1e3 / rate

    chunk_ms = ms(bytes_by_phase["total"])
    budget = float(period_ms) - float(safety_margin_ms)
    if basis == "floor":
        note = FLOOR_NOTE
    else:
        note = f"{basis} efficiency: {100 * efficiency:.1f} % of copy bandwidth" + (
            f" ({shape} shape, the model's own)" if shape else "")
    if board.copy_gbps is None:
        note += "; " + PEAK_NOTE
    return {
        "board": board.name, "bandwidth_gbps": board.effective_gbps,
        "bandwidth_kind": "measured copy" if board.copy_gbps else "vendor peak",
        "efficiency": float(efficiency), "basis": basis, "note": note, "shape": shape,
        "vision_ms": ms(bytes_by_phase["vision"]), "prefill_ms": ms(bytes_by_phase["prefill"]),
        "decode_pass_ms": ms(bytes_by_phase["decode_pass"]), "decode_ms": ms(bytes_by_phase["decode"]),
        "chunk_ms": chunk_ms, "budget_ms": budget, "fits": chunk_ms <= budget,
        "verdict": "fits" if chunk_ms <= budget else "does not fit",
    }


def memory_fit(plan_total_bytes: int, board: Board) -> dict:
    """The VRAM plan against the board's memory (1 GB = 1e9 bytes). On shared-memory boards the CPU, the OS
    and every other process use the same memory, so "within" says only that the plan alone is smaller."""
    frac = plan_total_bytes / (board.memory_gb * 1e9)
    note = "shared with the CPU and OS" if board.shared_memory else "dedicated GPU memory"
    return {"plan_bytes": int(plan_total_bytes), "memory_gb": board.memory_gb, "fraction": frac,
            "within": frac <= 1.0, "shared_memory": board.shared_memory, "note": note}
