"""Bad nodes carried from an infrastructure failure to the next try of the same task instance.

They live in the task instance's state store (``context["task_state_store"]``, Airflow 3.3, AIP-103):

- it is scoped to (DAG run, task, map index) and shared by every try of that task instance: what try 1 records,
  try 2 reads;
- its rows go away with the DAG run (foreign key, ON DELETE CASCADE), after ``[state_store]
  default_retention_days`` (``airflow db clean``), and on success when ``[state_store] clear_on_success`` is set;
  the key is also deleted here when the job succeeds.

The alternatives do not fit: a global Airflow Variable (what was used before) outlives the run, so exclusions
of failed runs piled up forever; XCom of a task instance is cleared when a new try starts (the execution API
only keeps it across a deferral), so try 2 would never see what try 1 recorded.

Without a store in the context (a hand-made context in a test or a script), nothing is carried.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from npa_airflow.slurm.operators.outage import cluster_read
from npa_airflow.slurm.watch.failures import validate_exclusions

if TYPE_CHECKING:
    from npa_airflow.slurm.hook import SlurmHook

BAD_NODES_KEY = "npa_slurm_bad_nodes"


def _store(context: Mapping[str, Any]) -> Any:
    return context.get("task_state_store")


def carried_bad_nodes(context: Mapping[str, Any], log: logging.Logger) -> list[str]:
    """Nodes an earlier try of this task instance recorded as bad ([] if none or unreadable)."""
    store = _store(context)
    if store is None:
        return []
    try:
        carried = store.get(BAD_NODES_KEY)
    except Exception as exc:
        log.warning("Could not read the nodes an earlier try excluded: %s", exc)
        return []
    return [str(n) for n in carried] if isinstance(carried, list) else []


def remember_bad_nodes(context: Mapping[str, Any], nodes: Sequence[str], log: logging.Logger) -> bool:
    """Add `nodes` to what the next try excludes; False if they could not be recorded."""
    store = _store(context)
    if store is None:
        log.warning("No task state store in this context: the next try will not exclude %s", ", ".join(nodes))
        return False
    try:
        previous = store.get(BAD_NODES_KEY) or []
        store.set(BAD_NODES_KEY, sorted(set(previous) | set(nodes)))
    except Exception as exc:
        log.warning("Could not record bad nodes %s for the next try: %s", ", ".join(nodes), exc)
        return False
    return True


def forget_bad_nodes(context: Mapping[str, Any], log: logging.Logger) -> None:
    """The job succeeded: nothing is carried any more."""
    store = _store(context)
    if store is None:
        return
    try:
        store.delete(BAD_NODES_KEY)
    except Exception as exc:
        log.debug("Could not clear the carried bad nodes: %s", exc)


def validated_exclusions(context: Mapping[str, Any], hook: SlurmHook, log: logging.Logger) -> list[str]:
    """The carried bad nodes that still exist on the cluster (`scontrol show nodes`, read through an outage)."""
    carried = carried_bad_nodes(context, log)
    if not carried:
        return []
    nodes = cluster_read(log, "reading nodes", hook.nodes)
    valid = [n for n in carried if n in nodes]
    dropped = sorted(set(carried) - set(valid))
    if dropped:
        log.warning("Not excluding %s: no such node in `scontrol show nodes`", ", ".join(dropped))
    if valid:
        log.info("Excluding node(s) %s that failed an earlier try", ", ".join(valid))
    return valid


def record_bad_nodes(
    context: Mapping[str, Any], hook: SlurmHook, bad_nodes: Sequence[str], log: logging.Logger
) -> list[str]:
    """Carry the nodes of an infrastructure failure that exist on the cluster to the next try; the ones carried."""
    if not bad_nodes:
        return []
    try:
        known = hook.nodes()
    except Exception as exc:
        log.warning("Could not validate bad nodes against scontrol (%s); not excluding them", exc)
        return []
    valid = sorted(validate_exclusions(bad_nodes, known))
    if not valid or not remember_bad_nodes(context, valid, log):
        return []
    return valid
