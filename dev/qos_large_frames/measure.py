# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Issue 30.5: how many 960x540 rgb8 frames (1.5 MB) at 25 Hz reach the camera process, per QoS / profile variant.

    . scripts/env.sh && python dev/qos_large_frames/measure.py default,subrel,pubbe,camprof,camprof_repprof,subauto

default: best-effort subscription (qos_reliability best_effort) of a reliable replay; subrel: reliable; subauto:
auto; pubbe: the replay --best-effort; camprof: config/fastdds_shm.xml in the camera process (what the launch files
do); repprof: the same profile in the replay too. Prints frames_received per second over 10 s (/diagnostics)."""
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(_root, "test"), _root]
from ros_helpers import Listener, Proc, ros_env, micro_model_dir, ROOT  # noqa: E402
from vla_edge_ros.synthetic_bag import make_test_bag  # noqa: E402
tmp = Path(tempfile.mkdtemp(prefix="vla_qos_"))
bag = tmp / "bag960"
if not bag.exists():
    make_test_bag(bag, frames=50, fps=25.0, width=960, height=540, storage="sqlite3")
model = micro_model_dir()
variants = sys.argv[1].split(",")
res = {}
for v in variants:
    domain = random.randint(101, 200)
    sub_rel = "reliable" if "subrel" in v else ("auto" if "subauto" in v else "best_effort")
    pub_be = "pubbe" in v
    prof = str(ROOT / "config" / "fastdds_shm.xml")
    node_env = {"VLA_EDGE_CAMERA_FASTDDS_PROFILE": prof} if "camprof" in v else {}
    rep_env = {"FASTRTPS_DEFAULT_PROFILES_FILE": prof} if "repprof" in v else {}
    args = ["-m", "vla_edge_ros.nodes.bringup", "--ros-args", "--params-file", str(ROOT / "config" / "vla_edge.yaml"),
            "-p", f"model_path:={model}", "-p", "kv_capacity_tokens:=512", "-p", f"qos_reliability:={sub_rel}",
            "-r", "image:=/camera/image_raw"]
    node = Proc(args, ros_env(domain, node_env), tmp / f"node_{v}.log")
    rargs = ["-m", "vla_edge_ros.tools.replay", str(bag), "--loop"] + (["--best-effort"] if pub_be else [])
    rep = Proc(rargs, ros_env(domain, rep_env), tmp / f"rep_{v}.log")
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 30, 60, "actions")
        time.sleep(3)
        d0 = lst.last_diag(); t0 = time.monotonic()
        time.sleep(10)
        d1 = lst.last_diag(); t1 = time.monotonic()
        rate = (int(d1.get("frames_received", 0)) - int(d0.get("frames_received", 0))) / (t1 - t0)
        res[v] = dict(rate=round(rate, 1), camera_rate_hz=d1.get("camera_rate_hz"), stale=d1.get("fallback_rate_stale_frame"))
    except AssertionError as e:
        res[v] = str(e)
    finally:
        lst.close(); node.stop(); rep.stop()
    print(v, res[v], flush=True)
print(json.dumps(res))
