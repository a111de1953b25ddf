"""`benchmarks/run --only triggerer`: bring up the production shape, stop its second triggerer, measure an idle
window, then each N on this provider and on the anchor (benchmarks/triggerer.py), print the tables, and take
the deployment down again (or leave it up with both triggerers, --keep-airflow)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cluster import ClusterEnv
from benchmarks.deployment import DAG_ID, MEASURED_TRIGGERER, Deployment, sshd_listener_pids
from benchmarks.report import json_safe
from benchmarks.sampler import Sampler
from benchmarks.triggerer import SIDES, Options, SideResult, idle_window, remove_anchor_job_dirs, run_side, warm_up
from benchmarks.triggerer_phases import LOGIN_PORTS, Bench, log
from benchmarks.triggerer_report import rpc_types, side_by_side

ANCHOR_DIST = "apache-airflow-providers-ssh"
ANCHOR_VERSION = "7.0.1"


@dataclass
class DeploymentOptions:
    home: str = "/var/tmp/npa-airflow-bench"
    port: int = 28290
    fresh: bool = True
    keep: bool = False
    poll_interval: int = 5
    sample_interval: float = 1.0
    # Written after every side (the run takes hours): the results so far, as JSON, and their tables.
    progress_path: str | None = None


def run(cluster: ClusterEnv, opts: Options, dep: DeploymentOptions) -> dict:
    anchor_version = importlib.metadata.version(ANCHOR_DIST)
    if anchor_version != ANCHOR_VERSION:
        log(f"warning: {ANCHOR_DIST} {anchor_version} installed; the issue names {ANCHOR_VERSION}")
    capacity = max(1000, *opts.sizes) + 100
    deployment = Deployment.create(
        cluster, capacity=capacity, poll_interval=dep.poll_interval, home=dep.home, port=dep.port
    )
    bench_dir = Path(cluster.shared) / "bench"
    bench_dir.mkdir(exist_ok=True)
    shutil.chown(bench_dir, cluster.user, cluster.user)
    sampler: Sampler | None = None
    try:
        log(f"bringing up the production shape in {dep.home} (port {dep.port})")
        deployment.up(dep.fresh)
        deployment.only_measured_triggerer()
        deployment.api.wait_for_dag(DAG_ID, timeout=300)
        listeners = sshd_listener_pids(cluster, LOGIN_PORTS)
        sampler = Sampler(deployment.pid(MEASURED_TRIGGERER), LOGIN_PORTS, listeners, dep.sample_interval).start()
        bench = Bench(cluster=cluster, deployment=deployment, db=deployment.metadata_db(), sampler=sampler)
        bench.calibrate_probe()
        log("warm-up: one unmeasured task per side")
        warm_up(bench, opts, bench_dir)
        results = [idle_window(bench, opts)]
        _all_sizes(bench, opts, bench_dir, results, lambda: _save_progress(results, dep))
    finally:
        if sampler is not None:
            sampler.stop()
        remove_anchor_job_dirs()
        shutil.rmtree(bench_dir, ignore_errors=True)
        if dep.keep:
            deployment.both_triggerers()
        else:
            deployment.down()
    note = f"{ANCHOR_DIST} {anchor_version}."
    print(side_by_side(results, dep.poll_interval, note))
    print(rpc_types(results))
    return {"anchor_version": anchor_version, "poll_interval": dep.poll_interval, "results": results}


def _save_progress(results: list[SideResult], dep: DeploymentOptions) -> None:
    if dep.progress_path is None:
        return
    Path(dep.progress_path).write_text(json.dumps(json_safe({"poll_interval": dep.poll_interval, "results": results})))
    Path(dep.progress_path).with_suffix(".md").write_text(
        side_by_side(results, dep.poll_interval) + "\n\n" + rpc_types(results) + "\n"
    )


def _all_sizes(
    bench: Bench, opts: Options, bench_dir: Path, results: list[SideResult], progress: Callable[[], None]
) -> None:
    """Each N in turn, this provider then the anchor; `results` grows by one entry per side, then `progress`."""
    progress()
    stopped_at: dict[str, int] = {}
    for n in opts.sizes:
        for side in (s for s in SIDES if s in opts.sides):
            if side in stopped_at:
                results.append(SideResult(side=side, n=n, stopped=f"not run: stopped short at N={stopped_at[side]}"))
                continue
            result = run_side(bench, side, n, opts, bench_dir)
            results.append(result)
            progress()
            if result.stopped:
                stopped_at[side] = n
            time.sleep(opts.settle)
