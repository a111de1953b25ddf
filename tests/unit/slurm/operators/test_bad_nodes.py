"""carried_bad_nodes / remember_bad_nodes / forget_bad_nodes against a dict-backed task state store.

The operator-level path (a NODE_FAIL try records, the next try excludes, success forgets) is tested in
test_operator_base.py; these call the functions directly, including a store that fails.
"""

from __future__ import annotations

import logging

import pytest

from npa_airflow.slurm.operators.bad_nodes import (
    BAD_NODES_KEY,
    carried_bad_nodes,
    forget_bad_nodes,
    remember_bad_nodes,
)
from tests.harness.slurm_operator_doubles import TaskStateStoreDouble

LOG = logging.getLogger("test_bad_nodes")


class BrokenStore:
    """A store whose every call fails (the execution API is unreachable)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get(self, key, default=None):
        self.calls.append("get")
        raise ConnectionError("execution API unreachable")

    def set(self, key, value, *, retention=None):
        self.calls.append("set")
        raise ConnectionError("execution API unreachable")

    def delete(self, key):
        self.calls.append("delete")
        raise ConnectionError("execution API unreachable")


def test_nothing_is_carried_without_a_store_or_a_value():
    assert carried_bad_nodes({}, LOG) == []
    assert carried_bad_nodes({"task_state_store": TaskStateStoreDouble()}, LOG) == []


def test_carried_nodes_are_read_as_strings():
    store = TaskStateStoreDouble()
    store.values[BAD_NODES_KEY] = ["c1", 7]
    assert carried_bad_nodes({"task_state_store": store}, LOG) == ["c1", "7"]


@pytest.mark.parametrize("damaged", ["c1", {"c1": True}, 3])
def test_a_value_that_is_not_a_list_carries_nothing(damaged):
    store = TaskStateStoreDouble()
    store.values[BAD_NODES_KEY] = damaged
    assert carried_bad_nodes({"task_state_store": store}, LOG) == []


def test_an_unreadable_store_carries_nothing_and_warns(caplog):
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert carried_bad_nodes({"task_state_store": BrokenStore()}, LOG) == []
    assert "Could not read the nodes an earlier try excluded" in caplog.text


def test_remembered_nodes_accumulate_sorted_without_duplicates():
    store = TaskStateStoreDouble()
    ctx = {"task_state_store": store}
    assert remember_bad_nodes(ctx, ["c3", "c1"], LOG) is True
    assert store.values == {BAD_NODES_KEY: ["c1", "c3"]}
    assert remember_bad_nodes(ctx, ["c2", "c1"], LOG) is True
    assert store.values == {BAD_NODES_KEY: ["c1", "c2", "c3"]}
    assert carried_bad_nodes(ctx, LOG) == ["c1", "c2", "c3"]


def test_remember_without_a_store_reports_false_and_names_the_nodes(caplog):
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert remember_bad_nodes({}, ["c1", "c2"], LOG) is False
    assert "No task state store" in caplog.text and "c1, c2" in caplog.text


def test_remember_into_a_failing_store_reports_false(caplog):
    store = BrokenStore()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert remember_bad_nodes({"task_state_store": store}, ["c4"], LOG) is False
    assert store.calls == ["get"]
    assert "Could not record bad nodes c4" in caplog.text


def test_remember_when_only_the_write_fails_reports_false():
    class ReadOnlyStore(TaskStateStoreDouble):
        def set(self, key, value, *, retention=None):
            raise PermissionError("read only")

    store = ReadOnlyStore()
    store.values[BAD_NODES_KEY] = ["c1"]
    assert remember_bad_nodes({"task_state_store": store}, ["c2"], LOG) is False
    assert store.values == {BAD_NODES_KEY: ["c1"]}


def test_forget_deletes_the_key_only():
    store = TaskStateStoreDouble()
    store.values.update({BAD_NODES_KEY: ["c1"], "other": 1})
    forget_bad_nodes({"task_state_store": store}, LOG)
    assert store.values == {"other": 1}
    forget_bad_nodes({"task_state_store": store}, LOG)  # nothing left to delete: still fine
    assert store.values == {"other": 1}


def test_forget_never_raises():
    store = BrokenStore()
    forget_bad_nodes({"task_state_store": store}, LOG)
    forget_bad_nodes({}, LOG)
    assert store.calls == ["delete"]
