"""DAG parse cost: what importing the provider's DAG-facing modules adds on top of `import airflow.sdk`.

Each figure comes from a fresh interpreter (median of --reps): `import airflow.sdk` first, then the module,
timed with perf_counter; `python -X importtime` names the biggest contributors of what is new. Modules that do
not exist yet are listed as such.
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import subprocess
import sys

from benchmarks.report import table

DAG_FACING = (
    "npa_airflow.slurm.operators",
    "npa_airflow.slurm.sensors",
    "npa_airflow.burst.operators",
    "npa_airflow.burst.sensors",
)
ALSO_MEASURED = ("npa_airflow.slurm.triggers", "npa_airflow.burst.triggers")
FORBIDDEN = ("asyncssh", "paramiko", "sky", "sshtunnel", "httpx", "requests", "cryptography")
BUDGET_MS = 30.0

_PROBE = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import airflow.sdk
t1, c1 = time.perf_counter(), time.process_time()
base = set(sys.modules)
for name in sys.argv[1:]:
    __import__(name)
t2, c2 = time.perf_counter(), time.process_time()
new = sorted(set(sys.modules) - base)
print(json.dumps({"sdk_ms": (t1 - t0) * 1000, "extra_ms": (t2 - t1) * 1000, "new": new,
                  "sdk_cpu_ms": (c1 - c0) * 1000, "extra_cpu_ms": (c2 - c1) * 1000,
                  "base_top": sorted({m.split(".")[0] for m in base})}))
"""
_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def probe(modules: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def top_contributors(modules: list[str], limit: int = 4) -> list[tuple[str, float]]:
    """Self time (ms) of the modules imported after airflow.sdk, biggest first (`-X importtime`)."""
    code = "import airflow.sdk\n" + "".join(f"import {m}\n" for m in modules)
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True).stderr
    lines = [_IMPORTTIME.match(line) for line in err.splitlines()]
    entries = [(m.group(4), int(m.group(1)), len(m.group(3))) for m in lines if m]
    sdk_at = max(i for i, (name, _, indent) in enumerate(entries) if name == "airflow.sdk" and indent == 1)
    after = entries[sdk_at + 1 :]
    return [(name, us / 1000) for name, us, _ in sorted(after, key=lambda e: -e[1])[:limit]]


def measure(modules: list[str], reps: int) -> dict:
    samples = [probe(modules) for _ in range(reps)]
    new = samples[-1]["new"]
    base_top = set(samples[-1]["base_top"])
    heavy = sorted({m.split(".")[0] for m in new if m.split(".")[0] in FORBIDDEN and m.split(".")[0] not in base_top})
    return {
        "sdk_ms": statistics.median(s["sdk_ms"] for s in samples),
        "extra_ms": statistics.median(s["extra_ms"] for s in samples),
        "sdk_cpu_ms": statistics.median(s["sdk_cpu_ms"] for s in samples),
        "extra_cpu_ms": statistics.median(s["extra_cpu_ms"] for s in samples),
        "extra_ms_min": min(s["extra_ms"] for s in samples),
        "extra_cpu_ms_min": min(s["extra_cpu_ms"] for s in samples),
        "new_modules": len(new),
        "forbidden": heavy,
        "top": top_contributors(modules),
    }


def run(reps: int) -> dict:
    print("... import cost", file=sys.stderr, flush=True)
    present = [m for m in (*DAG_FACING, *ALSO_MEASURED) if exists(m)]
    missing = [m for m in (*DAG_FACING, *ALSO_MEASURED) if m not in present]
    rows, raw = [], {}
    groups = [[m] for m in present]
    dag_facing = [m for m in present if m in DAG_FACING]
    if len(dag_facing) > 1:
        groups.append(dag_facing)
    sdk = []
    for group in groups:
        result = measure(group, reps)
        sdk.append(result["sdk_ms"])
        label = group[0] if len(group) == 1 else "all DAG-facing modules together"
        raw[label] = result
        top = ", ".join(f"{name} {ms:.1f}" for name, ms in result["top"])
        within = "yes" if result["extra_ms_min"] <= BUDGET_MS else "NO"
        if group[0] not in DAG_FACING and len(group) == 1:
            within = "(triggerer only)"
        rows.append(
            [
                label,
                result["extra_ms_min"],
                result["extra_ms"],
                result["extra_cpu_ms"],
                result["new_modules"],
                ", ".join(result["forbidden"]) or "none",
                within,
                top,
            ]
        )
    sdk_cpu = [r["sdk_cpu_ms"] for r in raw.values()]
    note = (
        f"`import airflow.sdk` alone: median {statistics.median(sdk):.0f} ms wall, "
        f"{statistics.median(sdk_cpu):.0f} ms CPU. Budget: {BUDGET_MS:.0f} ms extra, judged on the fastest of "
        f"{reps} runs (other work on the 2 cores only ever adds time)."
    )
    if missing:
        note += " Not present in this tree: " + ", ".join(missing) + "."
    print(
        table(
            "DAG parse cost (fresh interpreter, after `import airflow.sdk`)",
            [
                "module",
                "extra wall ms (min)",
                "extra wall ms (median)",
                "extra CPU ms (median)",
                "new modules",
                "heavy imports",
                "within budget",
                "top self-time contributors, ms",
            ],
            rows,
            note,
        )
    )
    raw["sdk_ms"] = statistics.median(sdk) if sdk else None
    raw["missing"] = missing
    if exists(ANCHOR_MODULE):
        raw["versus_anchor"] = versus_anchor(max(reps, 5))
    return raw


ANCHOR_MODULE = "airflow.providers.ssh.operators.ssh_remote_job"


def versus_anchor(reps: int) -> dict:
    """The provider's operators next to the SSH provider's SSHRemoteJobOperator module, probed alternately in
    fresh interpreters of the same Python (so both see the same load), as a ratio of the extra time."""
    print("... import cost vs the SSH provider's operator", file=sys.stderr, flush=True)
    operators = [m for m in DAG_FACING if m.endswith(".operators") and exists(m)]
    groups = {"npa_airflow operators (" + ", ".join(operators) + ")": operators, ANCHOR_MODULE: [ANCHOR_MODULE]}
    samples: dict[str, list[dict]] = {label: [] for label in groups}
    for rep in range(reps):
        order = list(groups.items()) if rep % 2 == 0 else list(groups.items())[::-1]
        for label, modules in order:
            samples[label].append(probe(modules))
    anchor_min = min(s["extra_ms"] for s in samples[ANCHOR_MODULE])
    rows, raw = [], {}
    for label, runs in samples.items():
        extra_min = min(s["extra_ms"] for s in runs)
        extra_median = statistics.median(s["extra_ms"] for s in runs)
        raw[label] = {"extra_ms_min": extra_min, "extra_ms": extra_median, "new_modules": len(runs[-1]["new"])}
        ratio = extra_min / anchor_min if anchor_min else None
        rows.append([label, extra_min, extra_median, len(runs[-1]["new"]), ratio])
    sdk = statistics.median(s["sdk_ms"] for runs in samples.values() for s in runs)
    note = (
        f"{reps} fresh interpreters each, alternating; `import airflow.sdk` median {sdk:.0f} ms in the same runs. "
        f"Budget for the provider's operators: {BUDGET_MS:.0f} ms extra (fastest run)."
    )
    headers = ["module(s)", "extra wall ms (min)", "extra wall ms (median)", "new modules", "ratio to SSH op (min)"]
    print(table("DAG parse cost: the provider's operators vs SSHRemoteJobOperator", headers, rows, note))
    raw["sdk_ms"] = sdk
    return raw
