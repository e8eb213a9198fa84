"""vla_edge: CameraNode + ReasoningNode in one process, sharing one FrameBuffer (DESIGN.md §3).

Each node spins on its own SingleThreadedExecutor in its own thread, so a slow reasoning step can
never stall the camera callback.  The reasoning node is a lifecycle node: with ``autostart`` (default
true) its executor thread configures (model, engine, warm-up) and activates it before spinning; with
``autostart:=false`` it waits in 'unconfigured' for ``ros2 lifecycle set /vla_edge configure`` /
``activate``.  The main thread only waits for a signal, so SIGINT / SIGTERM stop the process promptly
in every state (a configure in progress gives up between warm-up chunks): timers cancelled, executors
stopped, the shutdown transition (one zero action if active, engine released), nodes destroyed,
context shut down, exit 0.  Impossible parameters print one message and exit with status 2; a model or
engine that cannot start, one message and status 3.

    vla_edge --ros-args --params-file config/vla_edge.yaml -r image:=/camera/image_raw
    python -m vla_edge_ros.nodes.bringup --ros-args -p make_tiny_model:=true

Launch files must not set a node ``name``: ``__node:=`` would rename both nodes of the process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

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


def main(argv=None) -> int:
    if "numpy" not in sys.modules:
        limit_blas_threads()
    # A thread waiting for the GIL gets it after at most this long: the reasoning timer must not
    # sit 5 ms (the default) behind the engine worker or the camera callback.
    sys.setswitchinterval(0.0005)
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from ..frame_buffer import FrameBuffer
    from .camera_node import CameraNode
    from .params import ParamError, undeclared_overrides, unknown_parameters_message
    from .reasoning_node import ReasoningNode

    args = sys.argv if argv is None else argv
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as e:  # noqa: BLE001 - rcl refuses the ROS arguments: a params file, a remap, a -p rule
        print(f"vla_edge: bad ROS arguments: {ros_args_error(e)}", file=sys.stderr, flush=True)
        return EXIT_BAD_PARAMS
    stop = threading.Event()
    nodes: list = []

    def _on_signal(signum, frame):
        stop.set()
        for n in nodes:  # a configure in progress (model load, warm-up) gives up within ~50 ms
            if getattr(n, "abort", None) is not None:
                n.abort.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    fb = FrameBuffer()
    camera = reasoning = None
    try:
        try:
            camera = CameraNode(fb)
        except ParamError as cam_err:
            # report the reasoning node's parameter problems in the same message
            try:
                ReasoningNode(fb, validate_only=True).destroy_node()
            except ParamError as e:
                raise ParamError(f"{cam_err}; {e}") from None
            raise
        reasoning = ReasoningNode(fb, camera=camera)
        nodes.append(reasoning)
        # a key one node does not declare may belong to the other (-p applies to both): unknown = neither
        known = set(camera._parameters) | set(reasoning._parameters)
        msg = unknown_parameters_message((undeclared_overrides(camera) | undeclared_overrides(reasoning)) - known,
                                         known)
        if msg:
            reasoning.get_logger().warn(msg)
        if stop.is_set():
            reasoning.abort.set()
    except ParamError as e:
        print(f"vla_edge: invalid parameters: {e}", file=sys.stderr, flush=True)
        _teardown(rclpy, [camera, reasoning])
        return EXIT_BAD_PARAMS
    except KeyboardInterrupt:
        _teardown(rclpy, [camera, reasoning])
        return 130

    # Both executors spin from the start, so the lifecycle services answer at once. With autostart the
    # reasoning thread configures (model, engine, warm-up) and activates the node before it spins; the main
    # thread only waits, so SIGINT/SIGTERM are handled within ~0.2 s in every state.
    startup: dict = {}
    executors = []
    threads = []
    for name, node in (("camera", camera), ("reasoning", reasoning)):
        ex = SingleThreadedExecutor()
        ex.add_node(node)
        prio = int(reasoning.p.get("realtime_priority", 0)) if node is reasoning else 0
        before = (lambda: _autostart(reasoning, stop, startup)) if node is reasoning else None
        t = threading.Thread(target=_spin, args=(ex, stop, name, prio, before), name=f"exec-{name}", daemon=True)
        executors.append(ex)
        threads.append(t)
    for t in threads:
        t.start()
    try:
        while not stop.wait(0.2):
            if not all(t.is_alive() for t in threads):
                print("vla_edge: an executor thread stopped unexpectedly", file=sys.stderr, flush=True)
                break
    except KeyboardInterrupt:
        pass
    stop.set()
    reasoning.abort.set()
    # Timers first, then the executors (a tick in flight finishes), and only then the engine: closing the
    # engine under a running tick would turn a clean shutdown into an engine_error fallback.
    reasoning.stop_timers()
    for ex in executors:
        ex.shutdown(timeout_sec=2.0)
    for t in threads:
        t.join(timeout=2.0)
    code = 0
    err = startup.get("error")
    if err is not None:
        print(f"vla_edge: {'invalid parameters: ' if isinstance(err, ParamError) else ''}{err}", file=sys.stderr,
              flush=True)
        code = EXIT_BAD_PARAMS if isinstance(err, ParamError) else EXIT_STARTUP
    _teardown(rclpy, [camera, reasoning])
    return code


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
        if reasoning.p["autostart"]:
            reasoning.get_logger().info("vla_edge running (camera and reasoning executors started, node active)")
        return True
    if reasoning.startup_error is not None:
        startup["error"] = reasoning.startup_error
    stop.set()
    return False


def _spin(executor, stop: threading.Event, name: str, realtime_priority: int = 0, before=None) -> None:
    from rclpy.executors import ExternalShutdownException

    if before is not None:
        try:
            if not before():
                return
        except Exception as e:  # noqa: BLE001 - report, then let main() shut the process down
            print(f"vla_edge: {name} start-up failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            stop.set()
            return
    if realtime_priority > 0:
        # On a busy CPU the thread that waits for a chunk wakes milliseconds late; real-time priority lets
        # it preempt the engine worker, the camera and other processes the moment its wait ends.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime_priority))  # 0: this thread
        except (PermissionError, OSError) as e:
            print(f"vla_edge: realtime_priority {realtime_priority} refused ({e}); normal scheduling",
                  file=sys.stderr, flush=True)
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    except Exception as e:  # noqa: BLE001 - report, then let main() shut the process down
        print(f"vla_edge: {name} executor failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        stop.set()


def _teardown(rclpy, nodes) -> None:
    for n in nodes:
        if n is None:
            continue
        try:
            if hasattr(n, "stop"):
                n.stop()  # the reasoning node: shutdown transition (one zero action if active, engine released)
            n.destroy_node()
        except Exception:  # noqa: BLE001
            pass
    rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
