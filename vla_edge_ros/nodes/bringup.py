# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla_edge: the ReasoningNode in this process, the CameraNode in a child process, one shared FrameBuffer
(DESIGN.md §3).

The camera lives in its own process (``camera_process.py``) so that nothing that arrives on the camera topic,
however large, can hold this process's interpreter: DDS receiving, deserialising and converting happen
there, and the frame crosses over through shared memory.  The reasoning node spins on its own executor
thread and is a lifecycle node: with ``autostart`` (default true) that thread configures (model, engine,
warm-up) and activates it before spinning; with ``autostart:=false`` it waits in 'unconfigured' for
``ros2 lifecycle set /vla_edge configure`` / ``activate``.  The main thread waits for a signal and watches the
camera process (started again if it dies or stops answering), so SIGINT / SIGTERM stop everything promptly
in every state (a configure in progress gives up between warm-up chunks): timers cancelled, executor
stopped, the shutdown transition (one zero action if active, engine released), camera process stopped,
node destroyed, context shut down, exit 0.  A ``shutdown`` transition requested from outside (a
lifecycle manager) ends the process the same way: a finalized node has nothing left to do.  With
autostart, impossible parameters (of either node) print one message and exit with status 2; a model,
engine or camera process that cannot start, one message and status 3.  With ``autostart:=false`` the
model and the cross-checks are validated at configure, which fails and leaves the node unconfigured.

    vla_edge --ros-args --params-file config/vla_edge.yaml -r image:=/camera/image_raw
    python -m vla_edge_ros.nodes.bringup --ros-args -p make_tiny_model:=true

Both processes get the same ROS arguments.  Launch files must not set a node ``name``: ``__node:=`` would
rename both nodes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from ..realtime import set_realtime_priority, tighten_gil_switch

EXIT_BAD_PARAMS = 2
EXIT_STARTUP = 3


def limit_blas_threads() -> None:
    """One BLAS thread unless the user chose otherwise (before NumPy loads).

    The NumPy backend's matrices are small; on a 2-core box a multi-threaded OpenBLAS competing with
    the camera, DDS and other processes was measured 40x slower (180 ms vs 4 ms a chunk), and it
    starves the timer thread.  Set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS to override.
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def asynchronous_publishing() -> None:
    """Fast DDS sends each message on a background thread instead of inside ``publish()`` (unless the user chose).

    rclpy's ``publish()`` holds the interpreter while rmw_fastrtps writes, and in the default synchronous mode the
    write includes the network send.  When another participant joins the domain (a camera driver starting, a
    ``ros2 topic echo``) that send was measured to stall for 130-340 ms in 12 of 90 joins (a ~/cycle publish; every
    thread of the process waited, so 2-8 control ticks were missed); with asynchronous publishing, 0 of 48.
    Set RMW_FASTRTPS_PUBLICATION_MODE to override.  Other RMW implementations ignore the variable.
    """
    os.environ.setdefault("RMW_FASTRTPS_PUBLICATION_MODE", "ASYNCHRONOUS")


TRANSPORTS_VAR = "FASTDDS_BUILTIN_TRANSPORTS"
PROFILE_VARS = ("FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE")
PROFILE_FILES = ("DEFAULT_FASTRTPS_PROFILES.xml", "DEFAULT_FASTDDS_PROFILES.xml")  # read from the working directory
# A Fast DDS profile for the camera process only (the launch files point it at config/fastdds_shm.xml): the camera
# gets it as FASTRTPS_DEFAULT_PROFILES_FILE, the reasoning process does not see it.
CAMERA_PROFILE_VAR = "VLA_EDGE_CAMERA_FASTDDS_PROFILE"
RANGE_VAR = "ROS_AUTOMATIC_DISCOVERY_RANGE"
# What rmw_fastrtps (Jazzy) builds for ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, minus its shared-memory transport:
# no multicast, a default unicast metatraffic locator, UDPv4 with 32 initial peer ports, 127.0.0.1 as initial peer.
# rmw_fastrtps adds shared memory for LOCALHOST unconditionally, so this process runs the same discovery from a
# default profile under the SUBNET range (for which rmw_fastrtps keeps the profile as it is).
UDP_LOCALHOST_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<!-- written by vla_edge (nodes/bringup.py): LOCALHOST discovery over UDP only, for its reasoning process -->
<dds xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>vla_edge_udp_localhost</transport_id>
        <type>UDPv4</type>
        <maxInitialPeersRange>32</maxInitialPeersRange>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="vla_edge_udp_localhost" is_default_profile="true">
      <rtps>
        <builtin>
          <metatrafficUnicastLocatorList><locator><udpv4/></locator></metatrafficUnicastLocatorList>
          <initialPeersList><locator><udpv4><address>127.0.0.1</address></udpv4></locator></initialPeersList>
        </builtin>
        <userTransports><transport_id>vla_edge_udp_localhost</transport_id></userTransports>
        <useBuiltinTransports>false</useBuiltinTransports>
      </rtps>
    </participant>
  </profiles>
</dds>
"""


def _udp_localhost_profile() -> str:
    """The path of UDP_LOCALHOST_PROFILE in the cache folder (written when missing or different)."""
    from ..cache import cache_root

    path = cache_root() / "fastdds_udp_localhost.xml"
    if not path.is_file() or path.read_text() != UDP_LOCALHOST_PROFILE:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(UDP_LOCALHOST_PROFILE)
        os.replace(tmp, path)
    return str(path)


def udp_only_transport() -> tuple[dict, str]:
    """Fast DDS without its shared-memory transport in this process, unless the user configured transports.

    The discovery stall's cause (BENCHMARKS.md): when another participant joins the domain, this participant's
    event thread opens the newcomer's shared-memory port while holding a lock every send of this participant
    needs, and the open waits on the port's inter-process mutex for as long as the newcomer holds it (180-340 ms
    measured); a ``publish()`` meanwhile blocks holding the interpreter, so every thread of the process waits.
    Without shared memory the open never happens.  This process publishes only small messages (actions, cycle
    reports, diagnostics, a small debug image), which UDP loopback carries at no measurable cost; the camera
    process keeps the user's transports (shared memory carries a local driver's large frames).
    Returns the environment the camera process must start with (the user's value, None = unset) and a line for
    the log.  With ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST rmw_fastrtps sets its own transports (shared memory
    and UDP, whatever FASTDDS_BUILTIN_TRANSPORTS says): this process then runs the same localhost discovery from
    UDP_LOCALHOST_PROFILE instead (the camera process keeps LOCALHOST). Other RMW implementations are left alone.

    The one rule, whoever starts the process (``vla_edge``, both launch files, the demo): the user's own transport
    settings (the variables above, a profile file in the working directory) apply to both processes; otherwise
    this process runs UDP only, and the camera process gets the profile named by ``VLA_EDGE_CAMERA_FASTDDS_PROFILE``
    (what the launch files set), else Fast DDS's defaults.
    """
    child_env = {TRANSPORTS_VAR: os.environ.get(TRANSPORTS_VAR)}
    camera_profile = os.environ.get(CAMERA_PROFILE_VAR)
    if camera_profile and not any(os.environ.get(v) for v in PROFILE_VARS):
        child_env[PROFILE_VARS[0]] = camera_profile
    fast_dds = os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp").startswith("rmw_fastrtps")
    if not fast_dds:
        return child_env, ""
    user = [f"{v}={os.environ[v]}" for v in (TRANSPORTS_VAR, *PROFILE_VARS) if os.environ.get(v)]
    user += [f"{f} in the working directory" for f in PROFILE_FILES if os.path.isfile(f)]
    if user:
        return child_env, f"DDS transports as configured ({', '.join(user)})"
    camera = f"the profile {camera_profile}" if PROFILE_VARS[0] in child_env else "defaults"
    if os.environ.get(RANGE_VAR, "").upper() == "LOCALHOST":
        try:
            profile = _udp_localhost_profile()
        except OSError as e:  # no writable cache folder: rmw_fastrtps's LOCALHOST transports, said in the log
            return child_env, (f"DDS transports: ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST with shared memory in this "
                               f"process too (the UDP-only profile could not be written: {e.strerror or e}); a "
                               f"participant joining the domain can then hold a publish for up to ~0.3 s")
        child_env[RANGE_VAR] = os.environ[RANGE_VAR]
        child_env.setdefault(PROFILE_VARS[0], None)
        os.environ[PROFILE_VARS[0]] = profile
        os.environ[RANGE_VAR] = "SUBNET"
        return child_env, (f"DDS transports: UDPv4 in this process, localhost discovery (no shared memory: no "
                           f"discovery stall), {camera} in the camera process")
    os.environ[TRANSPORTS_VAR] = "UDPv4"
    return child_env, f"DDS transports: UDPv4 in this process (no shared memory: no discovery stall), {camera} in " \
                      "the camera process"


class StopSteps:
    """How long each step of stopping took, from the signal (or the first step) on: printed as one line on
    stderr, so a slow stop names the step that held it."""

    def __init__(self) -> None:
        self.signalled_at: float | None = None
        self._last: float | None = None
        self._steps: list[tuple[str, float, str]] = []  # name, seconds, how it was cut short ("" if it was not)

    def signalled(self) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()

    def step(self, name: str, cut_short: str = "") -> None:
        """The step ``name`` is over; ``cut_short`` says how, when it did not end by itself (a timeout)."""
        now = time.monotonic()
        if self._last is None:
            self._last = self.signalled_at if self.signalled_at is not None else now
        self._steps.append((name, now - self._last, cut_short))
        self._last = now

    def line(self) -> str:
        since = "the signal" if self.signalled_at is not None else "the stop request"
        how = "stopped, not cleanly," if any(cut for _, _, cut in self._steps) else "stopped"
        parts = ", ".join(f"{name} {sec:.2f}" + (f" ({cut})" if cut else "") for name, sec, cut in self._steps)
        total = sum(sec for _, sec, _ in self._steps)
        return f"vla_edge: {how} {total:.2f} s after {since} (seconds per step: {parts})"


def main(argv=None) -> int:
    if "numpy" not in sys.modules:
        limit_blas_threads()
    asynchronous_publishing()
    camera_env, transport_note = udp_only_transport()
    tighten_gil_switch()
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from ..frame_buffer import FrameBuffer
    from ..shared_block import SharedBlockError
    from .camera_process import CameraProcess
    from ..settings import ParamError, unknown_parameters_message
    from .params import declared_names, undeclared_overrides
    from .reasoning_node import ReasoningNode

    args = sys.argv if argv is None else argv
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as e:  # noqa: BLE001 - rcl refuses the ROS arguments: a params file, a remap, a -p rule
        print(f"vla_edge: bad ROS arguments: {ros_args_error(e)}", file=sys.stderr, flush=True)
        return EXIT_BAD_PARAMS
    stop = threading.Event()
    nodes: list = []
    steps = StopSteps()

    def _on_signal(signum, frame):
        steps.signalled()
        stop.set()
        for n in nodes:  # a configure in progress (model load, warm-up) gives up within ~50 ms
            if getattr(n, "abort", None) is not None:
                n.abort.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    fb = camera = None
    try:  # a full or hostile /dev/shm is one line here, never a SIGBUS later (shared_block.py)
        fb = FrameBuffer(shared=True)
        camera = CameraProcess(fb, args, env=camera_env)
        camera.launch()  # the child boots (imports rclpy, reads its parameters) while this process builds its node
    except (SharedBlockError, OSError) as e:
        print(f"vla_edge: cannot start: {e}", file=sys.stderr, flush=True)
        if camera is not None:
            camera.stop()
        elif fb is not None:
            fb.close()
        rclpy.try_shutdown()
        return EXIT_STARTUP
    reasoning = None
    try:
        try:
            reasoning = ReasoningNode(fb, camera=camera)
            reasoning_error = None
        except ParamError as e:
            reasoning_error = e
        report = camera.wait_ready(abort=stop)
        if "param_error" in report:  # every node's parameter problems in one message
            parts = report["param_error"].split("; ") + (str(reasoning_error).split("; ") if reasoning_error else [])
            raise ParamError("; ".join(dict.fromkeys(parts)))  # a problem both nodes found, once
        if reasoning_error is not None:
            raise reasoning_error
        if not report["ok"]:
            if stop.is_set():  # SIGINT/SIGTERM while the camera process was starting: a clean stop
                _teardown(rclpy, reasoning, camera)
                return 0
            print(f"vla_edge: cannot start the camera process: {report['error']}", file=sys.stderr, flush=True)
            _teardown(rclpy, reasoning, camera)
            return EXIT_STARTUP
        nodes.append(reasoning)
        reasoning.on_finalized = stop.set  # a `shutdown` transition (a lifecycle manager) ends the process
        camera.no_frames_restart_s = reasoning.p.camera_restart_no_frames_s
        camera.log = node_log(reasoning.get_logger())
        # a key one node does not declare may belong to the other (-p applies to both): unknown = neither
        known = set(report["declared"]) | declared_names(reasoning)
        msg = unknown_parameters_message((set(report["undeclared"]) | undeclared_overrides(reasoning)) - known,
                                         known)
        if msg:
            reasoning.get_logger().warn(msg)
        if transport_note:
            reasoning.get_logger().info(transport_note)
        if stop.is_set():
            reasoning.abort.set()
    except ParamError as e:
        print(f"vla_edge: invalid parameters: {e}", file=sys.stderr, flush=True)
        _teardown(rclpy, reasoning, camera)
        return EXIT_BAD_PARAMS
    except KeyboardInterrupt:
        _teardown(rclpy, reasoning, camera)
        return 130

    # The executor spins from the start, so the lifecycle services answer at once. With autostart the
    # reasoning thread configures (model, engine, warm-up) and activates the node before it spins; the main
    # thread only waits and watches the camera process, so SIGINT/SIGTERM are handled within ~0.2 s in every state.
    startup: dict = {}
    spinner = ExecutorThread(reasoning, stop, "reasoning", int(reasoning.p.realtime_priority),
                             lambda: _autostart(reasoning, stop, startup))
    spinner.start()
    try:
        while not stop.wait(0.2):
            if not spinner.is_alive() and not stop.is_set():  # a start-up failure sets stop, then the thread ends
                print("vla_edge: the executor thread stopped unexpectedly", file=sys.stderr, flush=True)
                break
            camera.poll()
    except KeyboardInterrupt:
        pass
    stop.set()
    steps.step("wake")
    reasoning.abort.set()
    # Timers first, then the executor thread (a tick in flight finishes), and only then the engine: closing the
    # engine under a running tick would turn a clean shutdown into an engine_error fallback.
    reasoning.stop_timers()
    steps.step("executor thread", spinner.finish(timeout=2.0))
    code = 0
    err = startup.get("error")
    if err is not None:
        print(f"vla_edge: {'invalid parameters: ' if isinstance(err, ParamError) else ''}{err}", file=sys.stderr,
              flush=True)
        code = EXIT_BAD_PARAMS if isinstance(err, ParamError) else EXIT_STARTUP
    _teardown(rclpy, reasoning, camera, steps)
    if code == 0:  # a start-up failure's one line stays the only one
        print(steps.line(), file=sys.stderr, flush=True)
    return code


def node_log(logger):
    """``log(level, msg)`` onto an rclpy logger, one call site per severity: rclpy refuses ("Logger severity
    cannot be changed between calls") a call site that logged at another severity before, so a single
    ``getattr(logger, level)(msg)`` raised on the second severity it saw (issue 30.3)."""
    def log(level: str, msg: str) -> None:
        if level == "error":
            logger.error(msg)
        elif level == "warn":
            logger.warning(msg)
        elif level == "debug":
            logger.debug(msg)
        else:
            logger.info(msg)

    return log


def ros_args_error(e: BaseException) -> str:
    """rcl's message for arguments it cannot parse, in one line without the C source locations."""
    msg = " ".join(str(e).split())
    msg = msg.replace("failed to initialize rcl: ", "")
    return msg.split(", at /")[0]


def _autostart(reasoning, stop: threading.Event, startup: dict) -> bool:
    """configure + activate on the reasoning executor thread (before it spins). A failure stops the process:
    the main thread prints the one-line reason and exits 2 (parameters) or 3 (model, engine)."""
    if stop.is_set():
        return False
    if reasoning.autostart():
        if reasoning.p.autostart:
            reasoning.get_logger().info("vla_edge running (camera and reasoning executors started, node active)")
        return True
    if reasoning.startup_error is not None:
        startup["error"] = reasoning.startup_error
    stop.set()
    return False


class ExecutorThread:
    """A node's executor on a thread of its own: ``before`` (start-up; False or an exception ends the thread) and
    then the node's callbacks until ``stop`` is set; ``finish`` ends it.

    Not ``executor.spin()`` ended by ``executor.shutdown()`` from another thread: shutdown() destroys the executor's
    own wake-up guard condition while the spinning thread may be building its wait set, and that wait then never
    ends (ros2/rclpy#968; 31 of 300 such stops hung in dev/executor_shutdown_race.py, 0 of 300 this way). Here the
    thread waits one callback at a time on a guard condition of the node, which lives until the node is destroyed,
    so a trigger at any moment ends the wait; the executor is shut down only after the thread has left."""

    def __init__(self, node, stop: threading.Event, name: str, realtime_priority: int = 0, before=None) -> None:
        from rclpy.executors import SingleThreadedExecutor

        self._executor = SingleThreadedExecutor(context=node.context)
        self._executor.add_node(node)
        self._wake = node.create_guard_condition(lambda: None)
        self._stop = stop
        self._thread = threading.Thread(target=self._run, args=(name, realtime_priority, before), name=f"exec-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def finish(self, timeout: float = 2.0) -> str:
        """Stop the thread (a callback in flight finishes first) and shut the executor down. Returns "" when the
        thread left within ``timeout``, else what cut the wait short (the thread is a daemon: the process still
        ends)."""
        self._stop.set()
        self._wake.trigger()
        self._thread.join(timeout)
        left = not self._thread.is_alive()
        self._executor.shutdown(timeout_sec=0.0)
        return "" if left else f"still running after {timeout:g} s"

    def _run(self, name: str, realtime_priority: int, before) -> None:
        from rclpy.executors import ExternalShutdownException

        if before is not None:
            try:
                if not before():
                    return
            except Exception as e:  # noqa: BLE001 - report, then let main() shut the process down
                print(f"vla_edge: {name} start-up failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                self._stop.set()
                return
        refused = set_realtime_priority(realtime_priority)
        if refused:
            print(f"vla_edge: {refused}", file=sys.stderr, flush=True)
        try:
            while not self._stop.is_set():
                self._executor.spin_once()
        except ExternalShutdownException:
            pass
        except Exception as e:  # noqa: BLE001 - report, then let main() shut the process down
            print(f"vla_edge: {name} executor failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self._stop.set()


def _teardown(rclpy, reasoning, camera, steps: StopSteps | None = None) -> None:
    steps = steps if steps is not None else StopSteps()
    if reasoning is not None:
        try:
            reasoning.stop()  # shutdown transition (one zero action if active, engine released)
            steps.step("shutdown transition")
            reasoning.destroy_node()
        except Exception:  # noqa: BLE001
            pass
    steps.step("node destroyed")
    try:
        how = camera.stop()
    except Exception as e:  # noqa: BLE001 - the process ends anyway; the line says why this step failed
        how = f"failed: {type(e).__name__}"
    steps.step("camera process", how)
    rclpy.try_shutdown()
    steps.step("context")


if __name__ == "__main__":
    sys.exit(main())
