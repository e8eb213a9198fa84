# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Run a vla_edge bringup from a tool and watch it (shared by vla-edge-demo and vla-edge-soak).

* :func:`ensure_model`, :func:`config_file` - the model and the packaged parameters;
* :func:`bringup_commands` - ``vla_edge`` and a looping ``vla-edge-replay`` of a source as child commands
  (transport and topic picked from the source), :func:`child_env` - their environment;
* :class:`OutputListener` - the node's per-cycle statuses and the latest /diagnostics roll-up;
* :func:`stop_processes` - SIGINT newest first (a clean ROS shutdown), then kill what is left.

Only :class:`OutputListener` needs rclpy; the rest imports without ROS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from ..cache import generated_model

PKG_ROOT = Path(__file__).resolve().parents[2]  # the source tree when run in-tree
CAMERA_TOPIC = "/camera/image_raw"


def config_file() -> str | None:
    """Return the installed config/vla_edge.yaml (ament index), else the source tree's, else None."""
    try:
        from ament_index_python.packages import get_package_share_directory

        p = Path(get_package_share_directory("vla_edge_ros")) / "config" / "vla_edge.yaml"
        if p.is_file():
            return str(p)
    except Exception:  # noqa: BLE001 - not installed through colcon
        pass
    p = PKG_ROOT / "config" / "vla_edge.yaml"
    return str(p) if p.is_file() else None


def ensure_model(cache: Path, model: str | None, preset: str = "tiny", tag: str = "demo") -> str:
    """`model` if given, else the generated preset (seed 0) in the cache, made once."""
    if model:
        return model
    if not (Path(cache) / f"{preset}-seed0" / "config.json").is_file():
        print(f"[{tag}] generating the {preset} model into {Path(cache) / f'{preset}-seed0'}", flush=True)
    return generated_model(preset, 0, cache)


def bringup_command(model: str, policy: str, backend: str) -> list[str]:
    """`vla_edge` as a child process: the packaged config, the model, and the camera on /camera/image_raw."""
    cmd = [sys.executable, "-m", "vla_edge_ros.nodes.bringup", "--ros-args"]
    cfg = config_file()
    if cfg:
        cmd += ["--params-file", cfg]
    return cmd + ["-p", f"model_path:={model}", "-p", f"policy:={policy}", "-p", f"backend:={backend}",
                  "-r", f"image:={CAMERA_TOPIC}", "-r", f"image/compressed:={CAMERA_TOPIC}/compressed"]


def source_is_compressed(source: str) -> bool:
    """Tell whether `source` is a bag of CompressedImage (the node then subscribes image/compressed)."""
    from ..clips import BagClip, is_bag

    path = Path(source)
    return path.exists() and is_bag(path) and BagClip(str(path)).kind == "compressed"


def bringup_commands(model: str, source: str, policy: str = "fifo", backend: str = "auto",
                     kv_capacity: int | None = None, params: list[str] = (), quiet_replay: bool = False
                     ) -> tuple[list[str], list[str]]:
    """(vla_edge command, vla-edge-replay command) for running the bringup on a looping `source`."""
    node_cmd = bringup_command(model, policy, backend)
    if kv_capacity:
        node_cmd += ["-p", f"kv_capacity_tokens:={kv_capacity}"]
    compressed = source_is_compressed(source)
    if compressed:
        node_cmd += ["-p", "transport:=compressed"]
    for p in params:
        node_cmd += ["-p", p]
    replay_cmd = [sys.executable, "-m", "vla_edge_ros.tools.replay", str(source), "--loop"]
    if quiet_replay:
        replay_cmd.append("--quiet")
    replay_cmd += ["--topic", f"{CAMERA_TOPIC}/compressed"] if compressed else \
        ["--format", "raw", "--topic", CAMERA_TOPIC]
    return node_cmd, replay_cmd


def child_env() -> dict:
    """Return the children's environment: localhost discovery, one BLAS thread, this tree importable."""
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # leave cores to DDS and the camera with the numpy backend
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(PKG_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_processes(procs, timeout: float = 15.0) -> None:
    """SIGINT the children newest first (a clean ROS shutdown), then kill whatever is still running."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in reversed(procs):
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class OutputListener:
    """Every /vla_edge/cycle status and the latest /diagnostics roll-up of a running vla_edge.

    `cycles`: every cycle status as a key->value dict, in arrival order; `diag`: the key->value pairs of the
    latest /diagnostics array. Read both under `lock` (callbacks run on the spinning thread).
    """

    def __init__(self, node, cycle_depth: int = 100):
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        self.lock = threading.Lock()
        self.cycles: list[dict] = []
        self.diag: dict = {}
        node.create_subscription(DiagnosticStatus, "/vla_edge/cycle", self._on_cycle,
                                 QoSProfile(depth=cycle_depth, reliability=ReliabilityPolicy.RELIABLE))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)

    def _on_cycle(self, msg) -> None:
        with self.lock:
            self.cycles.append({v.key: v.value for v in msg.values})

    def _on_diag(self, msg) -> None:
        d = {}
        for status in msg.status:
            d.update({v.key: v.value for v in status.values})
        with self.lock:
            self.diag = d
