"""One try of SlurmSubmitOperator builds its SbatchSpec once and reads its Slurm connection once.

A try on a worker is: the DAG file parsed (the operator constructed: a pure check of its arguments, no spec), the
template fields rendered (the spec built, the script shown) and `execute` (the same spec prepared, staged and
submitted, the handle made from the same connection settings). Counted here: fresh specs (`SbatchSpec` built
from unbound fields; `bind` and `excluding` copies of a built one are not new builds) and connection reads.
"""

from __future__ import annotations

import pytest
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import TaskDeferred

from npa_airflow.slurm.commands import SubmitResult
from npa_airflow.slurm.operators.bad_nodes import BAD_NODES_KEY
from npa_airflow.slurm.submit.scripts import render_sbatch
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.slurm_operator_doubles import (
    UNIT_CONFIG,
    HookDouble,
    TaskStateStoreDouble,
    context,
    install_unit_connection,
    make_op,
    name,
)


class ConnectionReadingHook(HookDouble):
    """A HookDouble whose config is read from the connection at its first use and kept, as SlurmHook's is."""

    @property
    def config(self) -> SlurmConnectionConfig:
        if self._read is None:
            self._read = SlurmConnectionConfig.from_connection(BaseHook.get_connection("slurm_unit"))
        return self._read

    @config.setter
    def config(self, _ignored: SlurmConnectionConfig) -> None:
        self._read: SlurmConnectionConfig | None = None  # read from the connection, not given


@pytest.fixture
def counts(monkeypatch):
    install_unit_connection(monkeypatch)
    seen = {"specs": 0, "connection reads": 0}
    post_init, from_connection = SbatchSpec.__post_init__, SlurmConnectionConfig.from_connection

    def counting_post_init(spec):
        seen["specs"] += not spec.placeholders_bound
        post_init(spec)

    def counting_from_connection(conn):
        seen["connection reads"] += conn.conn_id == "slurm_unit"
        return from_connection(conn)

    monkeypatch.setattr(SbatchSpec, "__post_init__", counting_post_init)
    monkeypatch.setattr(SlurmConnectionConfig, "from_connection", staticmethod(counting_from_connection))
    return seen


@pytest.mark.parametrize("carried", [(), ("c2",)], ids=["first-try", "bad-node-carried"])
def test_a_try_builds_its_spec_once_and_reads_its_connection_once(counts, carried):
    store = TaskStateStoreDouble()
    if carried:
        store.set(BAD_NODES_KEY, list(carried))
    ctx = context(try_number=2, task_state_store=store)
    hook = ConnectionReadingHook(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])

    op = make_op(hook, exclude_nodes=["c9"])  # the DAG file parsed
    assert counts == {"specs": 0, "connection reads": 0}
    op.render_template_fields(ctx)
    shown = op.sbatch_script
    with pytest.raises(TaskDeferred):
        op.execute(ctx)

    assert counts == {"specs": 1, "connection reads": 1}
    [(_, _, _, submitted)] = [c for c in hook.calls if c[0] == "submit"]
    assert submitted["job_name"] in shown
    expected = ",".join(("c9", *carried))
    assert f"#SBATCH --exclude={expected}\n" in op.sbatch_script  # what was submitted, carried nodes included
    if not carried:
        assert op.sbatch_script == shown


def test_carried_nodes_added_to_the_built_spec_give_the_script_one_build_with_them_gives(counts):
    built = make_op(HookDouble(), exclude_nodes=["c9", "c1"]).build_spec(UNIT_CONFIG, name(2))
    at_once = make_op(HookDouble(), exclude_nodes=["c9", "c1", "c2", "c1"]).build_spec(UNIT_CONFIG, name(2))
    assert render_sbatch(built.excluding(["c2", "c1"])) == render_sbatch(at_once)
    assert at_once.exclude_nodes == ("c9", "c1", "c2")
