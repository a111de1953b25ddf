"""What the benchmarks read off the local cluster: its client settings, slurmctld and slurmdbd RPC counters,
and the sshd log (which connection ran how many remote commands).

The cluster is shared: other clients may talk to it during a run. Counters that cannot be attributed to one
client (sdiag, sacctmgr stats) are reported with the number of foreign SSH sessions seen in the same window,
so a noisy window is visible. SSH counts are exact: sshd logs every connection and every session with the
client's source port, and the benchmarks know their own ports.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "dev" / "cluster"

_RPC_LINE = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)")
_CONNECTION = re.compile(r"^Connection from (\S+) port (\d+) on ")
_SESSION = re.compile(r"^Starting session: \S+ for \S+ from (\S+) port (\d+) id \d+")


@dataclass(frozen=True)
class ClusterEnv:
    dir: str
    slurm_conf: str
    host: str
    port: int
    user: str
    key_file: str
    known_hosts: str
    conn_json: str
    root: str = ""  # the bed's root filesystem ("" when its Slurm is this machine's): admin commands run inside

    @property
    def shared(self) -> str:
        return f"{self.dir}/shared"

    @property
    def sshd_log(self) -> str:
        return f"{self.dir}/log/sshd-{self.port}.log"

    @classmethod
    def load(cls) -> ClusterEnv:
        out = subprocess.run([str(CLUSTER_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
        values: dict[str, str] = {}
        for line in out.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            if value:
                values[name] = shlex.split(value)[0]
        return cls(
            dir=values["NPA_CLUSTER_DIR"],
            slurm_conf=values["NPA_SLURM_CONF"],
            host="127.0.0.1",
            port=int(values["NPA_SSH_PORT"]),
            user=values["NPA_SSH_USER"],
            key_file=values["NPA_SSH_KEY"],
            known_hosts=values["NPA_KNOWN_HOSTS"],
            conn_json=values["AIRFLOW_CONN_SLURM_DEFAULT"],
            root=values.get("NPA_CLUSTER_ROOT", ""),
        )

    def ssh_argv(self, command: str, *, bind: str | None = None) -> list[str]:
        """The OpenSSH client, one new connection per call, host key checked (the one-ssh-per-step shape)."""
        argv = ["ssh", "-F", "/dev/null", "-i", self.key_file, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}"]
        if bind:
            argv += ["-b", bind]
        return [*argv, "-p", str(self.port), f"{self.user}@{self.host}", command]

    def admin(self, command: list[str]) -> str:
        """Run a Slurm client command as the administrator (sdiag, sacctmgr) where the bed's Slurm lives: here, or
        in its root filesystem (``dev/cluster exec``; a 22.05 client cannot talk to a 24.11 daemon)."""
        env = {**os.environ, "SLURM_CONF": self.slurm_conf}
        argv = [str(CLUSTER_SCRIPT), "exec", "--", *command] if self.root else command
        return subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=60).stdout


# -- RPC counters ------------------------------------------------------------------------------------------


def parse_rpc_counts(text: str, field: str = "count") -> dict[str, int]:
    """``Remote Procedure Call statistics by message type`` of sdiag / sacctmgr show stats -> {type: count}
    (``field="total_time"``: {type: microseconds the daemon spent on it})."""
    counts: dict[str, int] = {}
    in_section = False
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            in_section = True
            continue
        if in_section:
            match = _RPC_LINE.match(line)
            if match:
                counts[match.group(1)] = int(match.group(3) if field == "count" else _field(line, field))
            elif line.strip():
                break
    return counts


def _field(line: str, name: str) -> int:
    match = re.search(rf"\b{name}:(\d+)", line)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class RpcSnapshot:
    slurmctld: dict[str, int]
    slurmdbd: dict[str, int]


def rpc_snapshot(env: ClusterEnv) -> RpcSnapshot:
    return RpcSnapshot(
        slurmctld=parse_rpc_counts(env.admin(["sdiag"])),
        slurmdbd=parse_rpc_counts(env.admin(["sacctmgr", "show", "stats"])),
    )


def rpc_delta(before: RpcSnapshot, after: RpcSnapshot) -> tuple[Counter[str], Counter[str]]:
    """Per-type increase; a counter that went down (daemon restarted) counts from zero."""

    def diff(a: dict[str, int], b: dict[str, int]) -> Counter[str]:
        out: Counter[str] = Counter()
        for name, value in b.items():
            delta = value - a.get(name, 0)
            out[name] = value if delta < 0 else delta
        return +out

    return diff(before.slurmctld, after.slurmctld), diff(before.slurmdbd, after.slurmdbd)


# -- sshd log ------------------------------------------------------------------------------------------------


@dataclass
class SshdActivity:
    """Connections and command sessions sshd logged in a window, keyed by (client address, client port)."""

    connections: Counter[tuple[str, int]] = field(default_factory=Counter)
    sessions: Counter[tuple[str, int]] = field(default_factory=Counter)

    def count(self, *, ports: set[int] | None = None, address: str | None = None, mine: bool = True) -> tuple[int, int]:
        """(connections, sessions) of the selected clients (``mine=False``: everyone else)."""

        def selected(key: tuple[str, int]) -> bool:
            hit = (ports is None or key[1] in ports) and (address is None or key[0] == address)
            return hit if mine else not hit

        return (
            sum(n for k, n in self.connections.items() if selected(k)),
            sum(n for k, n in self.sessions.items() if selected(k)),
        )


def parse_sshd_log(text: str) -> SshdActivity:
    activity = SshdActivity()
    for line in text.splitlines():
        match = _CONNECTION.match(line)
        if match:
            activity.connections[(match.group(1), int(match.group(2)))] += 1
            continue
        match = _SESSION.match(line)
        if match:
            activity.sessions[(match.group(1), int(match.group(2)))] += 1
    return activity


class SshdLog:
    """Reads what sshd appended to its log since a mark."""

    def __init__(self, path: str) -> None:
        self.path = path

    def mark(self) -> int:
        return os.path.getsize(self.path)

    def since(self, mark: int) -> SshdActivity:
        with open(self.path, "rb") as fh:
            fh.seek(mark)
            return parse_sshd_log(fh.read().decode("utf-8", errors="replace"))


def local_port(conn: object) -> int:
    """The client-side port of an asyncssh connection (how sshd's log names it)."""
    return int(conn.get_extra_info("sockname")[1])  # type: ignore[attr-defined]
