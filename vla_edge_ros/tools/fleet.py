# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-fleet: a fleet's recorded bags through the node's own step, in parallel on Ray, in one report.

Each bag is one vla-edge-bench clip run (`bench.prepare_clip` + `bench.bench_clip`: the real ReasoningCycle through
`Runtime.step` on an absolute period, every model and policy in turn), sequentially inside one Ray actor; the bags
run in parallel over `--workers` actors, each with its own engine on the models it loaded once (GPU workers share a
GPU through fractional num_gpus). With no --address (and no RAY_ADDRESS) a local Ray starts on this machine and
stops with the run; with one, the same command runs on that cluster (bag and model paths must then be readable at
the same path on every node, and the package installed there). Scheduling, retries and resources are Ray's: a worker
that dies is restarted and its bag retried once, then reported.

Each bag's result is written atomically to OUT/bags/<name>-<hash>.json as it lands (a failed bag with its one-line
reason); --resume skips the bags whose result is there. OUT/fleet.json (the bench report's keys: "clips" holds one
bench clip entry per bag; beside them "bags" and the "fleet" aggregates), OUT/fleet.md and OUT/fleet.png are
written at the end, and on Ctrl-C (marked incomplete). Exit status: 0 every bag ran, 4 the report is complete but
some bags failed, 2 a usage or set-up error, 130 interrupted.

Usage examples:
  vla-edge-fleet bags/*.mcap --out /tmp/fleet
  vla-edge-fleet --manifest fleet.csv --model /models/qwen05b.gguf --backend cuda --workers 8 --out h200
  vla-edge-fleet --manifest fleet.yaml --address ray://head:10001 --policies semantic --out /shared/fleet
  vla-edge-fleet bags/ --out /tmp/fleet --resume
"""
from __future__ import annotations

import argparse
import copy
import csv
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from ..clips import BAG_EXTS, SYNTHETIC, ClipError, is_bag, open_clip
from ..engine import cuda_available
from ..model.checkpoint import check_model_path
from .bench import add_run_options, finish_run_args, open_models, prepare_clip, report_header
from .cli import Parser, bounded, fail, positive_int
from ..output_dir import atomic_file, write_json_atomic
from .fleet_report import build_report, write_markdown, write_plot

TOOL = "vla-edge-fleet"
MAX_BAGS = 100_000  # a manifest bound: a hostile file cannot make the driver hold millions of rows
MAX_META_CHARS = 200  # each metadata value, shortened
RESULT_VERSION = 1
# the run's settings that decide a bag's result: --resume refuses a folder made with others
FINGERPRINT_SKIP = {"inputs", "manifest", "out", "force", "resume", "redo_failed", "workers", "cpus_per_worker",
                    "gpus_per_worker", "address", "quiet", "verbose"}


class Bag(NamedTuple):
    """One input: the path as given (a manifest's relative to the manifest), its metadata (robot, site, ...)."""

    path: str
    metadata: dict


class FleetError(Exception):
    """A problem with the inputs or the output folder: one line, before any bag runs."""


# --- inputs ---------------------------------------------------------------------------------------------------

def read_manifest(path: str) -> list[Bag]:
    """A CSV (a header with a `path` column; the other columns are metadata) or YAML (a list of paths or of mappings
    with `path`, or such a list under `bags:`) manifest; relative paths are taken from the manifest's folder."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise FleetError(f"--manifest {path}: {e.strerror or e}") from e
    if p.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise FleetError(f"--manifest {path}: not YAML ({str(e).splitlines()[0]})") from e
        if isinstance(doc, dict):
            doc = doc.get("bags")
        if not isinstance(doc, list):
            raise FleetError(f"--manifest {path}: expected a list of bags (or a mapping with 'bags:')")
        rows = [{"path": x} if isinstance(x, str) else x for x in doc]
    elif p.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "path" not in reader.fieldnames:
            raise FleetError(f"--manifest {path}: a CSV manifest needs a 'path' column "
                             f"(has {', '.join(reader.fieldnames or []) or 'no header'})")
        rows = list(reader)
    else:
        raise FleetError(f"--manifest {path}: expected a .csv, .yaml or .yml file")
    bags = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("path"), str) or not row["path"].strip():
            raise FleetError(f"--manifest {path}: entry {i + 1} has no 'path'")
        if len(bags) >= MAX_BAGS:
            raise FleetError(f"--manifest {path}: more than {MAX_BAGS} bags")
        bag_path = row["path"].strip()
        if bag_path not in SYNTHETIC and not os.path.isabs(bag_path):
            bag_path = str(p.parent / bag_path)
        meta = {_printable(k): _printable("" if v is None else v) for k, v in row.items()
                if k != "path" and k is not None}
        bags.append(Bag(bag_path, meta))
    return bags


def _printable(v) -> str:
    """A metadata key or value as one short line: control characters (newlines included) as spaces, shortened."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(v))[:MAX_META_CHARS]


def expand_inputs(inputs: list[str], manifest: str | None) -> list[Bag]:
    """Paths, globs and folders of bags (a folder that is not itself a bag: the bags directly in it), then the
    manifest's; each bag once (by absolute path), in the order given."""
    bags: list[Bag] = []
    for spec in inputs:
        if spec in SYNTHETIC:
            bags.append(Bag(spec, {}))
            continue
        matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True)) if glob.has_magic(spec) else [spec]
        if not matches:
            raise FleetError(f"{spec}: matches no file")
        for m in matches:
            if os.path.isdir(m) and not is_bag(Path(m)):
                inner = sorted(str(q) for q in Path(m).iterdir()
                               if (q.is_dir() and is_bag(q)) or q.suffix.lower() in BAG_EXTS)
                if not inner:
                    raise FleetError(f"{m}: a folder with no rosbag2 bag in it")
                bags.extend(Bag(q, {}) for q in inner)
            else:
                bags.append(Bag(m, {}))  # a path that does not exist fails alone, with its reason, in the report
    if manifest:
        bags.extend(read_manifest(manifest))
    seen, out = set(), []
    for b in bags:
        key = b.path if b.path in SYNTHETIC else os.path.abspath(b.path)
        if key not in seen:
            seen.add(key)
            out.append(b)
    if not out:
        raise FleetError("no bags: give bag paths, globs or folders, or --manifest")
    if len(out) > MAX_BAGS:
        raise FleetError(f"more than {MAX_BAGS} bags")
    return out


def result_name(bag: str) -> str:
    """The result file of a bag: its name (safe characters only) and a hash of its absolute path."""
    key = bag if bag in SYNTHETIC else os.path.abspath(bag)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(os.path.normpath(bag)))[:80] or "bag"
    return f"{stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.json"


def display_name(bag: str) -> str:
    return os.path.basename(os.path.normpath(bag)) or bag


# --- one bag, in a worker -------------------------------------------------------------------------------------

def bag_run_args(args, path: str):
    """args for one bag: --seconds / --camera-hz, when not given, the bag's own length and rate (at most
    --max-clip-frames of it)."""
    a = copy.copy(args)
    if a.camera_hz is None or a.seconds is None:
        source = open_clip(path)
        fps = getattr(source, "native_fps", None) or source.fps
        frames = min(source.expected or a.max_clip_frames, a.max_clip_frames)
        if a.camera_hz is None:
            a.camera_hz = min(1000.0, max(0.1, float(fps)))
        if a.seconds is None:
            a.seconds = min(86400.0, max(0.01, frames / a.camera_hz))
    return a


def one_line(e: BaseException) -> str:
    """An error as `Type: its first line` (Ray's own messages run to tracebacks)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0].strip() if text else ''}"[:500]


class FleetWorker:
    """A Ray actor: the models loaded once, then one bag at a time through the bench's clip run."""

    def __init__(self, args, argv):
        from tqdm import tqdm

        from ..realtime import tighten_gil_switch

        tighten_gil_switch()  # as the node's process and the bench's
        # A cluster's workers run at Ray's worker_niceness (15 unless set): under load that starves the loop (the
        # micro chunk took 220-250 ms instead of ~10 under slow_host.sh -f 3). Back to 0 where allowed; each
        # result says the niceness its bag ran at.
        self.niceness = os.getpriority(os.PRIO_PROCESS, 0)
        if self.niceness > 0:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, 0)
                self.niceness = 0
            except OSError:
                pass
        self.args, self.argv = args, argv
        self.models = open_models(self.args)  # settles backend "auto" and the KV capacity on this worker's machine
        self.progress = tqdm(disable=True)

    def header(self) -> dict:
        return report_header(self.args, self.argv, self.models, TOOL)

    def run_bag(self, path: str, name: str) -> dict:
        import platform

        import ray

        from ..model.safetensors_io import ModelLoadError
        from ..runtime import StartupError

        ctx = ray.get_runtime_context()
        out = {"bag": path, "name": name, "worker": {"node": platform.node(), "pid": os.getpid(),
                                                     "actor": ctx.get_actor_id(), "niceness": self.niceness},
               "worker_restarted": bool(ctx.was_current_actor_reconstructed)}
        t0 = time.monotonic()
        try:
            a = bag_run_args(self.args, path)
            clip = prepare_clip(a, path)
            from .bench import bench_clip

            entry, _series = bench_clip(a, clip, self.models, self.progress, name)
            entry["run"] = {"seconds": a.seconds, "camera_hz": a.camera_hz}
            out.update(status="ok", error=None, clip=entry, seconds=a.seconds, camera_hz=a.camera_hz)
        except (ClipError, ModelLoadError, StartupError, ValueError, OSError) as e:
            out.update(status="failed", error=(str(e).strip().splitlines() or [type(e).__name__])[0][:500])
        except Exception as e:  # noqa: BLE001 - one bag's surprise is its own failure; the fleet goes on
            out.update(status="failed", error=f"internal error: {one_line(e)}")
        out["wall_s"] = time.monotonic() - t0
        return out


# --- command line -----------------------------------------------------------------------------------------------

def build_parser() -> Parser:
    p = Parser(prog=TOOL, description=__doc__.splitlines()[0],
               epilog=__doc__[__doc__.index("Usage examples:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", metavar="BAG",
                   help="rosbag2 bags (.mcap / .db3 / bag folders), video clips, globs, or folders of bags")
    p.add_argument("--manifest", help="a CSV (a 'path' column, the others metadata such as robot, site) or YAML "
                                      "(a list of paths or of mappings with 'path') of bags (default: none)")
    add_run_options(p, seconds=None, camera_hz=None, seconds_help="each bag's own length, at most --max-clip-frames",
                    camera_hz_help="each bag's own rate")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="Ray actors, each running one bag at a time with its own engine (default: as many as the "
                        "cluster's CPUs / --cpus-per-worker, at most the bags to run)")
    p.add_argument("--cpus-per-worker", type=bounded(0.0, 1024.0), default=1.0,
                   help="Ray num_cpus of each worker (default: 1)")
    p.add_argument("--gpus-per-worker", type=bounded(0.0, 64.0), default=None,
                   help="Ray num_gpus of each worker: fractions share a GPU (default: 1 / --workers with --backend "
                        "cuda, or auto on a machine with a GPU; 0 otherwise)")
    p.add_argument("--address", default=None,
                   help="an existing Ray cluster (e.g. auto, 10.0.0.1:6379, ray://head:10001) (default: "
                        "RAY_ADDRESS, else a local Ray started for this run)")
    p.add_argument("--out", required=True, help="output folder: bags/, fleet.json, fleet.md, fleet.png "
                                                "(default: none, required)")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in --out (made with the same settings) and run only the others "
                        "(default: off)")
    p.add_argument("--redo-failed", action="store_true", help="with --resume, run the bags that failed again "
                                                              "(default: keep their failure)")
    p.add_argument("--force", action="store_true", help="empty a non-empty --out first (default: refuse)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no printed summary (default: show)")
    p.add_argument("--verbose", action="store_true", help="show the workers' own output (default: off)")
    return p


def parse_args(argv):
    p = build_parser()
    a = finish_run_args(p, p.parse_args(argv))
    if a.redo_failed and not a.resume:
        p.error("--redo-failed goes with --resume")
    if a.resume and a.force:
        p.error("--resume keeps what is in --out; --force empties it: give one")
    return a


def fingerprint(args) -> dict:
    """The settings that decide a bag's result (run.json): the models, policies, timing and every node setting."""
    fp = {k: v for k, v in sorted(vars(args).items()) if k not in FINGERPRINT_SKIP}
    fp["model"] = [os.path.abspath(m) for m in args.model or []]
    return json.loads(json.dumps(fp, default=str))


def prepare_out(args, bags: list[Bag]) -> tuple[Path, dict]:
    """Check and set up --out: (bags folder, the results already there that --resume keeps, by bag path)."""
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise FleetError(f"--out {args.out}: is a file, not a folder")
    run_file, bags_dir = out / "run.json", out / "bags"
    fp = fingerprint(args)
    kept: dict = {}
    if out.is_dir() and any(out.iterdir()):
        if args.force:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        elif not args.resume:
            raise FleetError(f"--out {args.out}: folder is not empty (--resume to go on with it, --force to empty it)")
        else:
            try:
                old = json.loads(run_file.read_text())["fingerprint"]
            except (OSError, ValueError, KeyError, TypeError):
                raise FleetError(f"--out {args.out}: no readable run.json; not a vla-edge-fleet folder") from None
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            if diff:
                k = diff[0]
                raise FleetError(f"--resume: {args.out} was run with other settings ({k}: {old.get(k)!r} there, "
                                 f"{fp.get(k)!r} now{'' if len(diff) == 1 else f'; {len(diff) - 1} more'})")
            for b in bags:
                try:
                    r = json.loads((bags_dir / result_name(b.path)).read_text())
                except (OSError, ValueError):
                    continue
                if (isinstance(r, dict) and r.get("version") == RESULT_VERSION and r.get("bag") == b.path
                        and (r.get("status") == "ok" or (r.get("status") == "failed" and not args.redo_failed))):
                    kept[b.path] = r
    out.mkdir(parents=True, exist_ok=True)
    bags_dir.mkdir(exist_ok=True)
    if not args.resume or not run_file.exists():
        write_json_atomic(str(run_file), {"tool": TOOL, "fingerprint": fp})
    return bags_dir, kept


def gpu_sampler(stop: threading.Event, samples: list) -> threading.Thread | None:
    """Samples this machine's GPU utilisation (nvidia-smi, 1 s) while the fleet runs; None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None

    def loop():
        while not stop.wait(1.0):
            try:
                r = subprocess.run([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=5)
                samples.extend(float(x) for x in r.stdout.split() if x.strip())
            except (OSError, ValueError, subprocess.SubprocessError):
                return

    t = threading.Thread(target=loop, name="gpu-sampler", daemon=True)
    t.start()
    return t


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        import ray
    except ImportError:
        return fail(TOOL, "Ray is not installed: pip install 'ray==2.60.0' (requirements.txt, or pip install "
                          ".[fleet]; scripts/setup.sh installs it)")
    for m in args.model or []:
        problem = check_model_path(m)
        if problem:
            return fail(TOOL, problem)
    try:
        bags = expand_inputs(args.inputs, args.manifest)
        bags_dir, kept = prepare_out(args, bags)
    except FleetError as e:
        return fail(TOOL, e)
    try:
        return run(args, argv, ray, bags, bags_dir, kept)
    except FleetError as e:
        return fail(TOOL, e)
    except Exception as e:  # noqa: BLE001 - one line for the user; VLA_EDGE_DEBUG=1 shows the traceback
        if os.environ.get("VLA_EDGE_DEBUG"):
            raise
        return fail(TOOL, f"internal error: {one_line(e)} (VLA_EDGE_DEBUG=1 for the traceback)", 1)


def start_ray(ray, args) -> str:
    """ray.init on --address / RAY_ADDRESS, else a local Ray of this run only; returns the mode for the report."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats prompt or upload from a tool
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    common = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=args.verbose)
    # Ray's C++ core writes its retries to fd 2 while it connects: kept aside, so a refusal stays one line
    with tempfile.TemporaryFile("w+") as side:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(side.fileno(), 2)
        try:
            if address:
                ray.init(address=address, **common)
                return f"cluster {address}"
            # results are small: a small object store keeps the local Ray within a CI host's /dev/shm. Ray starts
            # its workers at niceness 15 by default; a bag's loop must run as the node's does, at normal priority
            ray.init(address="local", object_store_memory=128 * 2**20, _system_config={"worker_niceness": 0},
                     **common)
            return "local"
        except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError...: one line
            side.seek(0)
            said = [m.group(1) for m in re.finditer(r"\] \S+\.cc:\d+: (.+)", side.read())]
            cause = f"; {said[-1].strip()}" if said else ""  # e.g. the auth token refused, in Ray's words
            raise FleetError(f"Ray: cannot {'connect to ' + address if address else 'start locally'} "
                             f"({one_line(e)}{cause})"[:600]) from None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if args.verbose:
                side.seek(0)
                sys.stderr.write(side.read())


def run(args, argv, ray, bags: list[Bag], bags_dir: Path, kept: dict) -> int:
    from tqdm import tqdm

    todo = [b for b in bags if b.path not in kept]
    results: dict = {b.path: {**r, "resumed": True} for b in bags if (r := kept.get(b.path))}
    tmp_model = None
    interrupted = False
    stop_sampling, gpu_samples = threading.Event(), []
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a supervisor's stop is a Ctrl-C: same clean end
    t_start = time.monotonic()
    workers = 0
    mode = "not started"
    actors = []
    try:
        wargs = copy.copy(args)
        if not wargs.model:  # one generated model for every worker (the same seed gives the same weights anyway)
            from ..model.generate import make_model

            tmp_model = tempfile.mkdtemp(prefix=f"vla-fleet-{args.preset}-")
            wargs.model = [make_model(tmp_model, preset=args.preset, seed=args.seed)]
            names = [f"generated {args.preset} (seed {args.seed})"]
        else:
            names = list(args.model)
        mode = start_ray(ray, args)
        cpus = ray.cluster_resources().get("CPU", 1.0)
        workers = args.workers or max(1, int(cpus // max(args.cpus_per_worker, 1e-3)))
        workers = max(1, min(workers, len(todo))) if todo else 0
        gpu = args.backend == "cuda" or (args.backend == "auto" and cuda_available())
        gpus = args.gpus_per_worker if args.gpus_per_worker is not None else (1.0 / max(1, workers) if gpu else 0.0)
        remote = ray.remote(FleetWorker).options(num_cpus=args.cpus_per_worker, num_gpus=gpus, max_restarts=-1,
                                                 max_task_retries=1)
        actors = [remote.remote(wargs, argv) for _ in range(max(1, workers))]
        try:
            header = ray.get(actors[0].header.remote())
        except ray.exceptions.RayError as e:
            raise FleetError(f"the workers could not start: {one_line(e)}") from None
        header["model"]["name"] = ", ".join(names) if len(names) > 1 else names[0]
        sampler = gpu_sampler(stop_sampling, gpu_samples)
        progress = tqdm(total=len(todo), unit="bag", file=sys.stderr, disable=args.quiet, desc=TOOL)
        queue = list(reversed(todo))
        pending = {}
        failed_now = 0

        def submit(i):
            b = queue.pop()
            pending[actors[i].run_bag.remote(b.path, display_name(b.path))] = (i, b)

        for i in range(workers):
            if queue:
                submit(i)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in done:
                    i, b = pending.pop(ref)
                    try:
                        r = ray.get(ref)
                    except ray.exceptions.RayError as e:  # the worker died twice on this bag (retried once)
                        r = {"bag": b.path, "name": display_name(b.path), "status": "failed",
                             "error": f"worker died (retried once): {one_line(e)}", "worker_restarted": True}
                    r.update(version=RESULT_VERSION, metadata=b.metadata, resumed=False)
                    write_json_atomic(str(bags_dir / result_name(b.path)), r)
                    results[b.path] = r
                    failed_now += r["status"] != "ok"
                    progress.update(1)
                    progress.set_postfix_str(f"failed {failed_now}" if failed_now else "")
                    if queue:
                        submit(i)
        except KeyboardInterrupt:
            interrupted = True
        progress.close()
        stop_sampling.set()
        if sampler is not None:
            sampler.join(timeout=6)
        wall = time.monotonic() - t_start
        ran_now = sum(1 for b in todo if b.path in results)
        ordered = [results[b.path] for b in bags if b.path in results]
        fleet_run = {"complete": not interrupted, "bags_pending": len(bags) - len(ordered),
                     "bags_resumed": len(kept), "bags_run_now": ran_now, "workers": workers,
                     "cpus_per_worker": args.cpus_per_worker, "gpus_per_worker": gpus, "ray_mode": mode,
                     "ray_version": ray.__version__, "wall_s": wall,
                     "bags_per_hour": ran_now / wall * 3600.0 if ran_now and wall > 0 else None,
                     "gpu_utilization": _gpu_summary(gpu_samples)}
        report = build_report(header, ordered, fleet_run)
        out = Path(args.out)
        write_json_atomic(str(out / "fleet.json"), report)
        with atomic_file(out / "fleet.md") as tmp:
            write_markdown(report, tmp)
        with atomic_file(out / "fleet.png") as tmp:
            write_plot(report, tmp)
        f = report["fleet"]
        if not args.quiet:
            print(f"{TOOL}: {f['bags_ok']} of {f['bags']} bags ran, {f['bags_failed']} failed, {f['bags_pending']} "
                  f"not run, {f['bags_resumed']} resumed; {wall:.0f} s on {workers} workers ({mode}); report "
                  f"{out.resolve() / 'fleet.md'}")
            for r in ordered:
                if r["status"] != "ok":
                    print(f"  failed: {r['bag']}: {r['error']}")
        if interrupted:
            print(f"{TOOL}: interrupted; {out / 'fleet.json'} covers the {len(ordered)} bags done "
                  "(--resume goes on)", file=sys.stderr)
            return 130
        return 4 if f["bags_failed"] else 0
    except KeyboardInterrupt:
        print(f"{TOOL}: interrupted before the first result; the bags done are in {bags_dir}", file=sys.stderr)
        return 130
    finally:
        stop_sampling.set()
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if ray.is_initialized():
            ray.shutdown()  # a local Ray stops with it: no stray raylet or worker processes
        signal.signal(signal.SIGTERM, previous)
        if tmp_model is not None:
            shutil.rmtree(tmp_model, ignore_errors=True)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _gpu_summary(samples: list) -> dict | None:
    if not samples:
        return None
    return {"mean": sum(samples) / len(samples), "max": max(samples), "samples": len(samples)}


if __name__ == "__main__":
    sys.exit(main())
