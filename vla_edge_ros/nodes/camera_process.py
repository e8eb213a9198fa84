# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The camera node in its own process, handing frames to the control loop through shared memory (DESIGN.md §3).

Everything an image costs before it is a 64x128 frame happens in the camera process: DDS receiving and
reassembling the message (an 8K rgb8 frame is ~100 MB), copying it into Python, deserialising, decoding and
resizing.  In one process those held the interpreter (and the reasoning timer behind it) for hundreds of
milliseconds a frame; now the reasoning process only ever takes a frame out of the shared ``FrameBuffer``
(microseconds), whatever arrives on the camera topic.

``CameraProcess`` is the reasoning process's side:

* ``launch()`` starts the child (``multiprocessing`` spawn: a fresh interpreter, no state copied from a process
  that already runs DDS threads) with the same ROS arguments, so ``vla_camera`` gets the same parameters
  file, ``-p`` rules, remaps and namespace it had in one process; ``wait_ready()`` returns the child's report:
  its parameter problems (one line, merged with the reasoning node's by the bringup) or its declared
  parameters (for the unknown-parameter warning) and topic.
* ``start()`` asks the child to subscribe (the reasoning node calls it when it activates, as before).
* ``stats()`` reads the counters the child keeps in a small shared block (same keys as ``CameraNode.stats``,
  plus the process's pid, state and restarts).
* ``poll()`` (the bringup's main thread, every 0.2 s) is the watchdog: a child that exited, stopped
  answering for ``HANG_S``, or (``no_frames_restart_s`` > 0) has been subscribed with a publisher matched but
  received nothing for ``no_frames_restart_s`` is killed and started again (at most every
  ``RESTART_INTERVAL_S``) with a fresh swap lock; the reasoning side meanwhile publishes ``stale_frame``
  fallbacks and /diagnostics says why (``process_last_exit``; no-frame restarts also count in
  ``restarts_no_frames``).  A publisher that stays matched and silent (a paused bag) is not restarted every few
  seconds for ever: each further no-frame restart with no message in between doubles the wait, up to
  ``NO_FRAMES_BACKOFF_MAX`` times ``no_frames_restart_s``; a message received resets it.  The no-frame rule is
  for a DDS reader that stopped receiving from a writer still there (seen over Fast DDS shared memory after
  the reader stalled ~2.5 s): a new process is a new participant.
* ``poll()`` never raises: a restart that cannot be made (no room in /dev/shm for the swap lock, a spawn that
  fails) is kept as ``process_error`` (one line; state ``cannot start``), logged once, and tried again every
  ``RESTART_INTERVAL_S``; it is cleared when a child starts again, so the camera comes back by itself when
  space returns.
* At most one child exists at any time, ever: ``launch()`` kills and reaps the previous child before it starts
  another, and refuses (an error ``poll`` keeps and retries) while the previous one is still there; the
  pending-restart state is cleared the moment a child has started, before anything is logged; and logging never
  raises (``_log``: a log call that fails is written to stderr instead), so no step of a restart can leave a
  second child running.
* ``instruction_mailbox`` (``instruction_mailbox.py``, after the stats words in the same block): the child also
  takes the reasoning node's ``~/instruction`` topic, once the reasoning process has named it there, checks each
  message's size and CDR and leaves the latest text or refusal in the mailbox. rclpy's take copies a whole message
  under the interpreter lock, so a 10 MB message taken in the reasoning process held its control thread ~20 ms.
* ``stop()`` asks the child to exit, then terminates / kills it, and removes the shared blocks.

The child never outlives the reasoning process (``PR_SET_PDEATHSIG`` plus a parent-pid check), ignores
SIGINT (a Ctrl-C in the terminal reaches the whole process group; the parent decides when the camera stops)
and exits on SIGTERM.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import numpy as np

from ..constants import CAMERA_NO_FRAMES_RESTART_S
from ..frame_buffer import FrameBuffer
from ..frame_quality import CHECKS as QUALITY_CHECKS
from ..realtime import tighten_gil_switch
from ..shared_block import create_block, open_block, remove_block
from ..image_convert import DROP_KINDS
from ..instruction_mailbox import MAILBOX_BYTES, InstructionMailbox

STATS_PREFIX = "vla_edge_camera_"
READY_TIMEOUT_S = 60.0  # the child imports rclpy, builds its node and reports (seconds on a loaded 2-core box)
HANG_S = 5.0  # no heartbeat for this long (after its first): the child is killed and started again
RESTART_INTERVAL_S = 2.0  # at most one start this often
NOT_ANSWERING_S = 2.0  # heartbeat older than this: /diagnostics says the camera process is not answering
NO_FRAMES_RESTART_S = CAMERA_NO_FRAMES_RESTART_S  # default (the node's camera_restart_no_frames_s sets its own)
NO_FRAMES_BACKOFF_MAX = 8  # the longest no-frame wait, in units of no_frames_restart_s (a silent publisher)

# float64 words of the stats block. Written by the parent: CMD_*; by the child: everything else.
# Times are time.monotonic() (CLOCK_MONOTONIC: the same clock in both processes), 0 = never.
CMD_SUBSCRIBE, CMD_STOP, HEARTBEAT, SUBSCRIBED, RECEIVED, VALID, INVALID, RATE_HZ, CONVERT_MS = range(9)
MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS = 9, 10
PUBLISHERS, LAST_RECV, MATCHED_SINCE, SUBSCRIBED_AT = 11, 12, 13, 14  # matched publishers of the image topic
KIND0 = 16  # one word per DROP_KINDS entry
SOURCE_RATE, TOPIC_PUBLISHERS, RELIABLE = KIND0 + len(DROP_KINDS), KIND0 + len(DROP_KINDS) + 1, \
    KIND0 + len(DROP_KINDS) + 2  # the publisher's rate (header stamps), publishers on the topic (graph), QoS
# frame quality (frame_quality.py): 0/1 whether the child checks frames, then its counts, tripped mask, last values
Q_ON = RELIABLE + 1
Q_FRAMES, Q_REFUSED, Q_TRIPPED, Q_FAILED_LAST, Q_DETAIL, Q_MEAN, Q_MS = range(Q_ON + 1, Q_ON + 8)
Q_FAILED0 = Q_ON + 8  # one word per QUALITY_CHECKS entry: frames that failed the check
Q_TRIPS0 = Q_FAILED0 + len(QUALITY_CHECKS)  # one word per check: trips
STATS_WORDS = Q_TRIPS0 + len(QUALITY_CHECKS)
COUNTS = (RECEIVED, VALID, INVALID, *range(KIND0, RELIABLE + 1), Q_FRAMES, Q_REFUSED,
          *range(Q_FAILED0, STATS_WORDS))  # cumulative over restarts
STATS_BYTES = 8 * 64
BLOCK_BYTES = STATS_BYTES + MAILBOX_BYTES  # the stats words, then the ~/instruction mailbox (instruction_mailbox.py)


class CameraProcess:
    """The camera child's parent side.  ``no_frames_restart_s``: restart a child that is subscribed, has a
    publisher matched and received nothing for this long (0: never); None: the child's ``no_frames_restart_s``
    parameter when it declares one (its start-up report), else ``NO_FRAMES_RESTART_S``.  Settable at any time.
    Raises ``SharedBlockError`` (one line) when its stats block cannot be made."""

    def __init__(self, frame_buffer: FrameBuffer, ros_args: list[str], log=None, env: dict | None = None,
                 no_frames_restart_s: float | None = None, child_target=None):
        if not frame_buffer.shared:
            raise ValueError("CameraProcess needs FrameBuffer(shared=True)")
        self.fb = frame_buffer
        self.ros_args = list(ros_args)
        self.env = dict(env or {})  # applied in the child before rclpy starts (None = unset)
        self.log = log or (lambda level, msg: print(f"vla_edge: {msg}", file=sys.stderr, flush=True))
        self._no_frames_arg = no_frames_restart_s
        self.no_frames_restart_s = NO_FRAMES_RESTART_S if no_frames_restart_s is None else float(no_frames_restart_s)
        self._stats_path, self._stats_map = create_block(STATS_PREFIX, BLOCK_BYTES, "camera stats block")
        self._stats = np.frombuffer(self._stats_map, np.float64, STATS_BYTES // 8)
        # ~/instruction, taken in the child (a big message's take must not hold this process's interpreter)
        self.instruction_mailbox = InstructionMailbox(self._stats_map, STATS_BYTES)
        self._ctx = multiprocessing.get_context("spawn")
        self._target = child_target or child_main  # tests give a stand-in child body (faults at each step)
        self.hang_s, self.ready_timeout_s, self.restart_interval_s = HANG_S, READY_TIMEOUT_S, RESTART_INTERVAL_S
        self.proc = None
        self._conn = None
        self.report: dict = {}
        self.restarts = 0
        self.restarts_no_frames = 0
        self._no_frames_streak = 0  # no-frame restarts in a row with no message in between (the backoff)
        self.last_exit: str | None = None  # why the previous child ended, for /diagnostics
        self.process_error = ""  # why the child cannot be started again now (one line), "" when fine
        self._restart_pending = False  # a child to start again (the last attempt failed)
        self._started_at = 0.0  # the last start attempt, successful or not
        self._stopping = False
        # counts of the children before the current one (each child counts from 0): the reported counts add up
        self._base = np.zeros(STATS_WORDS, np.float64)

    # --- life cycle ----------------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the child (does not wait: ``wait_ready`` does).  Raises when it cannot (``poll`` catches it),
        and when the previous child cannot be ended: never a second child next to the first."""
        self._end_previous()
        for i in COUNTS:  # what the previous child counted stays counted
            self._base[i] += self._stats[i]
        self._stats[HEARTBEAT:STATS_WORDS] = 0.0
        self._stats[CMD_STOP] = 0.0
        self._started_at = time.monotonic()
        receiver, sender = self._ctx.Pipe(duplex=False)
        try:
            proc = self._ctx.Process(
                target=self._target, name="vla_camera",
                args=(self.fb.handle(), self._stats_path, self.ros_args, sender, os.getpid(), self.env), daemon=True)
            proc.start()
        except BaseException:
            receiver.close()
            sender.close()
            raise
        sender.close()
        if self._conn is not None:
            self._conn.close()
        self.proc, self._conn = proc, receiver

    def _end_previous(self) -> None:
        """Kill and reap the previous child, if any; raise if it is still there afterwards."""
        old = self.proc
        if old is None:
            return
        if old.is_alive():
            old.kill()
        old.join(2.0)
        if old.is_alive() or old.exitcode is None:
            raise RuntimeError(f"the previous camera process (pid {old.pid}) has not ended yet; not starting another")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, abort=None) -> dict:
        """The child's start-up report: ``{"ok": True, "declared": [...], "undeclared": [...], "topic": ...}`` or
        ``{"ok": False, "param_error": "..."}`` / ``{"ok": False, "error": "..."}``. Gives up when ``abort``
        (an Event) is set, the child dies, or after ``timeout``."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if abort is not None and abort.is_set():
                return {"ok": False, "error": "interrupted"}
            if self._conn.poll(0.05):
                try:
                    self.report = self._conn.recv()
                except EOFError:
                    break
                if self._no_frames_arg is None and self.report.get("no_frames_restart_s") is not None:
                    self.no_frames_restart_s = float(self.report["no_frames_restart_s"])
                return self.report
            if not self.proc.is_alive():
                break
        if self.proc.is_alive():
            return {"ok": False, "error": f"the camera process did not report ready within {timeout:.0f} s"}
        return {"ok": False, "error": f"the camera process exited during start-up ({describe_exit(self.proc)})"}

    def start(self) -> None:
        """Subscribe to the camera (the reasoning node calls this when it activates)."""
        self._stats[CMD_SUBSCRIBE] = 1.0

    def poll(self) -> None:
        """Watchdog (call periodically): start the child again if it exited, stopped answering, or receives
        nothing from a matched publisher.  Never raises: what went wrong is in ``process_error`` / the log."""
        try:
            self._poll()
        except Exception as e:  # noqa: BLE001 - the caller is the bringup's main thread: it must go on
            self._failed(f"camera watchdog: {_one_line(e)}")
            return
        if self.process_error and not self._restart_pending:  # the watchdog's own error, now gone
            self.process_error = ""

    def _poll(self) -> None:
        if self._stopping or self.proc is None:
            return
        now = time.monotonic()
        if self._restart_pending:  # the last start failed: try again every RESTART_INTERVAL_S
            if now - self._started_at >= self.restart_interval_s:
                self._start_again()
            return
        s = self._stats
        beat = s[HEARTBEAT]
        alive = self.proc.is_alive()
        # a child that has not reported yet is still booting (imports take seconds on a small board)
        hung = alive and (now - beat > self.hang_s if beat > 0 else now - self._started_at > self.ready_timeout_s)
        silent = self._no_frames_for(now) if alive and not hung else None
        if s[RECEIVED] > 0:
            self._no_frames_streak = 0
        if alive and not hung and silent is None:
            return
        if now - self._started_at < self.restart_interval_s:
            return
        if hung:
            self.last_exit = f"no heartbeat for {now - (beat or self._started_at):.1f} s: killed"
            self._kill()
        elif silent is not None:
            n = int(s[PUBLISHERS])
            self.last_exit = (f"no frame for {silent:.1f} s with {n} publisher{'s' if n != 1 else ''} matched: "
                              "killed")
            self.restarts_no_frames += 1
            self._no_frames_streak += 1
            self._kill()
        else:
            self.last_exit = describe_exit(self.proc)
        self.restarts += 1
        self._log("error", f"camera process {self.last_exit}; starting it again (restart {self.restarts})")
        self._restart_pending = True
        self._start_again()

    def _no_frames_for(self, now: float) -> float | None:
        """Seconds a subscribed child with a publisher matched has received nothing, when that is over the limit
        (with the backoff); else None."""
        s = self._stats
        limit = self.no_frames_restart_s
        if not limit or limit <= 0 or not s[SUBSCRIBED] or s[PUBLISHERS] < 1:
            return None
        since = max(s[LAST_RECV], s[MATCHED_SINCE], s[SUBSCRIBED_AT])
        if since <= 0:
            return None
        limit *= min(2 ** self._no_frames_streak, NO_FRAMES_BACKOFF_MAX)
        return now - since if now - since > limit else None

    def _start_again(self) -> None:
        try:
            self.fb.renew_lock()  # a child killed inside its index swap may have left the old lock held
            self.launch()
        except Exception as e:  # noqa: BLE001 - no room in /dev/shm, no fds, a spawn that fails: try again later
            self._started_at = time.monotonic()
            self._failed(f"cannot start the camera process: {_one_line(e)}")
            return
        # a child runs now: nothing below may leave the restart pending (the next poll would start another)
        self._restart_pending = False
        was, self.process_error = self.process_error, ""
        if was:
            self._log("info", f"camera process started again (was: {was})")

    def _failed(self, line: str) -> None:
        if line != self.process_error:  # logged once per distinct error, not every retry
            self._log("error", f"{line}; trying again every {self.restart_interval_s:.0f} s")
        self.process_error = line

    def _log(self, level: str, msg: str) -> None:
        """``self.log(level, msg)`` that never raises (a logger that refuses a call must not stop a restart)."""
        try:
            self.log(level, msg)
        except Exception as e:  # noqa: BLE001
            try:
                print(f"vla_edge: [{level}] {msg} (logger failed: {_one_line(e)})", file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001 - no stderr either: nothing left to tell
                pass

    def stop(self, timeout: float = 2.0) -> str:
        """Ask the child to exit (then SIGTERM, then SIGKILL) and remove the shared blocks. Returns how the child
        ended: "" when it exited on the request, "terminated" or "killed" when it did not within ``timeout``."""
        self._stopping = True
        how = ""
        if self.proc is not None:
            self._stats[CMD_STOP] = 1.0
            self.proc.join(timeout)
            if self.proc.is_alive():
                how = "terminated"
                self.proc.terminate()
                self.proc.join(1.0)
            if self.proc.is_alive():
                how = "killed"
                self._kill()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        remove_block(self._stats_path)
        self.fb.close()
        return how

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.join(2.0)

    # --- statistics (read from the diagnostics thread) ------------------------------------------------

    def stats(self) -> dict:
        s = self._stats.copy()
        for i in COUNTS:
            s[i] += self._base[i]
        now = time.monotonic()
        beat = float(s[HEARTBEAT])
        alive = self.proc is not None and self.proc.is_alive()
        answering = alive and beat > 0 and now - beat <= NOT_ANSWERING_S
        state = "running" if answering else ("starting" if alive and beat == 0 else
                                             ("not answering" if alive else "exited"))
        if self._restart_pending and self.process_error:
            state = "cannot start"
        return {
            "transport": self.report.get("transport", ""),
            "topic": self.report.get("topic", "") if s[SUBSCRIBED] else "",
            "received": int(s[RECEIVED]),
            "valid": int(s[VALID]),
            "invalid": int(s[INVALID]),
            "invalid_by_kind": {k: int(s[KIND0 + i]) for i, k in enumerate(DROP_KINDS) if s[KIND0 + i]},
            "rate_hz": float(s[RATE_HZ]) if answering else 0.0,
            "convert_ms_last": float(s[CONVERT_MS]),
            "max_image_bytes": int(s[MAX_IMAGE_BYTES]),
            "max_image_pixels": int(s[MAX_IMAGE_PIXELS]),
            "process_pid": self.proc.pid if self.proc is not None else 0,
            "process_state": state,
            "process_restarts": self.restarts,
            "process_last_exit": self.last_exit or "",
            "process_error": self.process_error,
            "restarts_no_frames": self.restarts_no_frames,
            "publishers_matched": int(s[PUBLISHERS]) if alive else 0,
            "topic_publishers": int(s[TOPIC_PUBLISHERS]) if alive else 0,
            "source_rate_hz": float(s[SOURCE_RATE]) if answering else 0.0,
            "qos_reliability": ("reliable" if s[RELIABLE] else "best_effort") if s[SUBSCRIBED] else "",
            "last_frame_age_s": (now - float(s[LAST_RECV])) if alive and s[LAST_RECV] > 0 else float("nan"),
            "heartbeat_age_s": (now - beat) if beat > 0 else float("nan"),
            "quality": _quality_stats(s) if s[Q_ON] else {},
        }


def _quality_stats(s: np.ndarray) -> dict:
    """The child's frame-quality counts (the keys of CameraNode.quality_stats)."""
    out = {"frames": int(s[Q_FRAMES]), "refused_frames": int(s[Q_REFUSED]), "tripped": int(s[Q_TRIPPED]),
           "failed_last": int(s[Q_FAILED_LAST]), "detail_last": float(s[Q_DETAIL]), "mean_last": float(s[Q_MEAN]),
           "check_ms_last": float(s[Q_MS])}
    for i, c in enumerate(QUALITY_CHECKS):
        out[f"failed_{c}"] = int(s[Q_FAILED0 + i])
        out[f"trips_{c}"] = int(s[Q_TRIPS0 + i])
    return out


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if text else type(e).__name__


def describe_exit(proc) -> str:
    code = proc.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# --- the child ----------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """SIGTERM this process when the process that started it dies (Linux), even by SIGKILL."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the parent-pid check in the loop still ends the child
        pass


def child_main(fb_handle, stats_path: str, ros_args: list[str], conn, parent_pid: int, env: dict) -> None:
    """The camera process: a CameraNode publishing into the shared FrameBuffer until told to stop.

    ``env`` (name -> value, None = unset) is applied before rclpy starts: the reasoning process may run DDS with
    other transports than the user asked for (``bringup.udp_only_transport``); the camera gets the user's."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _die_with_parent()
    stop = {"now": False}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    if os.getppid() != parent_pid:
        return
    tighten_gil_switch()

    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from .camera_node import CameraNode
    from .instruction_input import relay_subscription
    from ..settings import ParamError
    from .params import declared_names, undeclared_overrides

    stats_map = open_block(stats_path, BLOCK_BYTES)
    s = np.frombuffer(stats_map, np.float64, STATS_BYTES // 8)
    mailbox = InstructionMailbox(stats_map, STATS_BYTES)
    fb = FrameBuffer.attach(fb_handle)
    try:
        rclpy.init(args=ros_args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as e:  # noqa: BLE001 - the parent has already accepted these arguments
        conn.send({"ok": False, "error": f"camera process: rclpy.init failed: {e}"})
        return
    node = None
    try:
        try:
            node = CameraNode(fb)
        except ParamError as e:
            conn.send({"ok": False, "param_error": str(e)})
            return
        except ParameterException as e:  # rclpy's own parameters (use_sim_time:=maybe): the same one line
            conn.send({"ok": False, "param_error": _one_line(e)})
            return
        if node.p["process_nice"] > 0:
            os.nice(int(node.p["process_nice"]))
        s[MAX_IMAGE_BYTES], s[MAX_IMAGE_PIXELS] = node.p["max_image_bytes"], node.p["max_image_pixels"]
        topic = "image/compressed" if node.p["transport"] == "compressed" else "image"
        conn.send({"ok": True, "declared": sorted(declared_names(node)),
                   "undeclared": sorted(undeclared_overrides(node)),
                   "transport": node.p["transport"], "topic": node.resolve_topic_name(topic),
                   "no_frames_restart_s": node.p.get("no_frames_restart_s")})
        conn.close()
        ex = SingleThreadedExecutor()
        ex.add_node(node)
        instructions = None
        while not stop["now"] and not s[CMD_STOP] and os.getppid() == parent_pid:
            if instructions is None:  # once the reasoning process has named the topic
                instructions = relay_subscription(node, mailbox)
            if s[CMD_SUBSCRIBE] and node.sub is None:
                node.start()
                s[SUBSCRIBED_AT] = time.monotonic()
                s[SUBSCRIBED] = 1.0
            ex.spin_once(timeout_sec=0.05)
            node.recheck_qos()
            _write_stats(s, node)
        ex.shutdown(timeout_sec=1.0)
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


def _write_stats(s: np.ndarray, node) -> None:
    st = node.stats()
    s[RECEIVED], s[VALID], s[INVALID] = st["received"], st["valid"], st["invalid"]
    s[RATE_HZ], s[CONVERT_MS] = st["rate_hz"], st["convert_ms_last"]
    for i, kind in enumerate(DROP_KINDS):
        s[KIND0 + i] = st["invalid_by_kind"].get(kind, 0)
    s[LAST_RECV] = st["last_recv_time"]
    s[SOURCE_RATE], s[TOPIC_PUBLISHERS], s[RELIABLE] = st["source_rate_hz"], st["topic_publishers"], st["reliable"]
    q = st.get("quality") or {}
    s[Q_ON] = 1.0 if q else 0.0
    if q:
        s[Q_FRAMES], s[Q_REFUSED], s[Q_TRIPPED] = q["frames"], q["refused_frames"], q["tripped"]
        s[Q_FAILED_LAST], s[Q_DETAIL], s[Q_MEAN], s[Q_MS] = q["failed_last"], q["detail_last"], q["mean_last"], \
            q["check_ms_last"]
        for i, c in enumerate(QUALITY_CHECKS):
            s[Q_FAILED0 + i], s[Q_TRIPS0 + i] = q[f"failed_{c}"], q[f"trips_{c}"]
    if node.sub is not None:
        matched = node.sub.get_publisher_count()
        if matched and not s[PUBLISHERS]:
            s[MATCHED_SINCE] = time.monotonic()
        s[PUBLISHERS] = matched
    s[HEARTBEAT] = time.monotonic()
