# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Run the vla_edge bringup under a watchdog: print any publish() over 20 ms, any full gen-2 gc over 10 ms, any
pause of the watchdog thread itself over 60 ms (the interpreter held), and the stacks when no tick came for 120 ms."""
import os, sys; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import threading, time, traceback
from vla_edge_ros.nodes import reasoning_node, bringup
last = [time.monotonic()]
import gc
_gc_t = [0.0]
def _gccb(phase, info):
    if phase == "start": _gc_t[0] = time.monotonic()
    else:
        d = time.monotonic() - _gc_t[0]
        if d > 0.01: print(f"GC gen {info['generation']} took {1000*d:.0f} ms at {time.monotonic():.3f} collected {info['collected']}", file=sys.stderr, flush=True)
gc.callbacks.append(_gccb)
import rclpy.publisher, rclpy.executors
def _timed(cls, name):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.monotonic(); r = f(*a, **k); d = time.monotonic() - t
        if d > 0.02 and name != "wait_for_ready_callbacks": print(f"SLOW {name} {a[0].topic_name} {1000*d:.0f} ms at {t:.3f}", file=sys.stderr, flush=True)
        return r
    setattr(cls, name, g)
_timed(rclpy.publisher.Publisher, "publish")
_timed(rclpy.publisher.Publisher, "get_subscription_count")
import rclpy.lifecycle.managed_entity

orig = reasoning_node.ReasoningNode._on_tick
def tick(self):
    last[0] = time.monotonic()
    return orig(self)
reasoning_node.ReasoningNode._on_tick = tick
def wd():
    dumped = 0
    t_start = time.monotonic()
    prev = time.monotonic()
    while True:
        time.sleep(0.01)
        now = time.monotonic()
        if now - prev > 0.06:
            print(f"WD {now:.3f}: watchdog itself slept {1000*(now-prev):.0f} ms (GIL held?)", file=sys.stderr, flush=True)
        prev = now
        if now - last[0] > 0.12 and dumped < 6 and now - t_start > 4:
            dumped += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            out = [f"WD {now:.3f}: no tick for {1000*(now-last[0]):.0f} ms"]
            for ident, fr in sys._current_frames().items():
                out.append(f"--- thread {names.get(ident)}")
                out.extend(l.rstrip() for l in traceback.format_stack(fr)[-6:])
            print("\n".join(out), file=sys.stderr, flush=True)
            last[0] = now
if __name__ == "__main__":
    threading.Thread(target=wd, daemon=True).start()
    sys.exit(bringup.main())
