"""The extra links (SlurmJobLink, BurstJobLink), their URL formatting and the connection-extra reader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey

from npa_airflow.common import links, xcom_keys
from tests.harness.slurm_operator_doubles import context, handle_dict

KEY = TaskInstanceKey(dag_id="d", task_id="t", run_id="manual__1", try_number=1, map_index=3)


def test_job_link_formats_the_site_template_or_points_at_the_xcom_tab(monkeypatch):
    from airflow.models.taskinstancekey import TaskInstanceKey

    from npa_airflow.common import links

    handle = {**handle_dict(), "job_name": "npa-a&b-t1"}
    assert (
        links.format_job_url("https://ood.example/activejobs?jobid={job_id}&name={job_name}", handle)
        == "https://ood.example/activejobs?jobid=101&name=npa-a%26b-t1"
    )
    key = TaskInstanceKey(dag_id="d", task_id="t", run_id="manual__1", try_number=1, map_index=3)
    monkeypatch.setattr(links.XCom, "get_value", staticmethod(lambda key, ti_key: handle))
    monkeypatch.setattr(links, "_job_url_template", lambda conn_id: None)
    assert links.SlurmJobLink().get_link(None, ti_key=key).endswith("/dags/d/runs/manual__1/tasks/t/mapped/3/xcom")
    monkeypatch.setattr(links, "_job_url_template", lambda conn_id: "https://site/job/{job_id}")
    assert links.SlurmJobLink().get_link(None, ti_key=key) == "https://site/job/101"
    monkeypatch.setattr(links.XCom, "get_value", staticmethod(lambda key, ti_key: None))
    assert links.SlurmJobLink().get_link(None, ti_key=key) == ""  # nothing submitted yet


def _xcom(monkeypatch, by_key: dict) -> list[str]:
    asked: list[str] = []

    def get_value(key, ti_key):
        asked.append(key)
        return by_key.get(key)

    monkeypatch.setattr(links.XCom, "get_value", staticmethod(get_value))
    return asked


def _extras(monkeypatch, by_conn: dict[str, dict]) -> list[str]:
    """BaseHook.get_connection served from `by_conn`; an unknown conn_id raises like a missing connection."""
    from airflow.sdk import BaseHook

    read: list[str] = []

    def get_connection(conn_id):
        read.append(conn_id)
        if conn_id not in by_conn:
            raise LookupError(f"The conn_id `{conn_id}` isn't defined")
        return SimpleNamespace(extra_dejson=by_conn[conn_id])

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(get_connection))
    return read


def test_xcom_url_quotes_the_parts_and_omits_an_unmapped_index(monkeypatch):
    from airflow.configuration import conf

    monkeypatch.setattr(conf, "get", lambda section, key, fallback=None: "https://airflow.example/")
    key = TaskInstanceKey(dag_id="d", task_id="t", run_id="manual__2026-01-01T00:00+00:00", try_number=1, map_index=-1)
    assert links.airflow_xcom_url(key) == (
        "https://airflow.example/dags/d/runs/manual__2026-01-01T00%3A00%2B00%3A00/tasks/t/xcom"
    )
    assert links.airflow_xcom_url(KEY) == "https://airflow.example/dags/d/runs/manual__1/tasks/t/mapped/3/xcom"


def test_format_job_url_quotes_every_value_and_blanks_missing_ones():
    handle = {"job_id": "7", "cluster": None, "results_dir": "/r/a b"}
    assert links.format_job_url("{job_id}|{cluster}|{results_dir}|{login_host}", handle) == "7||%2Fr%2Fa%20b|"


def test_format_job_url_refuses_a_field_it_does_not_know():
    with pytest.raises(KeyError):
        links.format_job_url("https://x/{user}", handle_dict())


def test_slurm_link_reads_the_template_from_the_connection_extra(monkeypatch):
    asked = _xcom(monkeypatch, {xcom_keys.SLURM_JOB: handle_dict()})
    read = _extras(monkeypatch, {"slurm_unit": {"job_url_template": "https://ood/{job_id}"}})
    assert links.SlurmJobLink().get_link(None, ti_key=KEY) == "https://ood/101"
    assert asked == [xcom_keys.SLURM_JOB] and read == ["slurm_unit"]


def test_slurm_link_falls_back_to_the_xcom_tab_on_an_invalid_template(monkeypatch, caplog):
    _xcom(monkeypatch, {xcom_keys.SLURM_JOB: handle_dict()})
    _extras(monkeypatch, {"slurm_unit": {"job_url_template": "https://ood/{nope}"}})
    assert links.SlurmJobLink().get_link(None, ti_key=KEY).endswith("/dags/d/runs/manual__1/tasks/t/mapped/3/xcom")
    assert "job_url_template" in caplog.text and "is invalid" in caplog.text


@pytest.mark.parametrize("value", [None, "101", {"job_id": ""}, {"cluster": "c"}])
def test_slurm_link_is_empty_without_a_handle_with_a_job_id(monkeypatch, value):
    _xcom(monkeypatch, {xcom_keys.SLURM_JOB: value})
    assert links.SlurmJobLink().get_link(None, ti_key=KEY) == ""


def _burst_handle(**over) -> dict:
    return {
        "conn_id": "sky",
        "endpoint": "https://sky.example/",
        "cluster": "npa-c 1",
        "job_id": 3,
        "request_id": "r/1",
        "name": "train",
        **over,
    }


def test_format_burst_url_keeps_the_endpoint_and_quotes_the_rest():
    url = links.format_burst_url("{endpoint}/c/{cluster}/j/{job_id}/{request_id}", _burst_handle())
    assert url == "https://sky.example/c/npa-c%201/j/3/r%2F1"
    assert links.format_burst_url("{job_id}", _burst_handle(job_id=0)) == "0"  # 0 is a value, not missing
    assert links.format_burst_url("[{name}]", _burst_handle(name=None)) == "[]"


def test_burst_link_uses_the_default_dashboard_without_a_template(monkeypatch):
    asked = _xcom(monkeypatch, {xcom_keys.BURST_JOB: _burst_handle()})
    _extras(monkeypatch, {"sky": {}})
    assert links.BurstJobLink().get_link(None, ti_key=KEY) == "https://sky.example/dashboard/clusters/npa-c%201"
    assert asked == [xcom_keys.BURST_JOB]


def test_burst_link_uses_the_connection_template(monkeypatch):
    _xcom(monkeypatch, {xcom_keys.BURST_JOB: _burst_handle()})
    _extras(monkeypatch, {"sky": {"dashboard_url_template": "https://dash/{cluster}/{job_id}"}})
    assert links.BurstJobLink().get_link(None, ti_key=KEY) == "https://dash/npa-c%201/3"


def test_burst_link_falls_back_to_the_default_on_an_invalid_template(monkeypatch, caplog):
    _xcom(monkeypatch, {xcom_keys.BURST_JOB: _burst_handle()})
    _extras(monkeypatch, {"sky": {"dashboard_url_template": "https://dash/{0}"}})
    assert links.BurstJobLink().get_link(None, ti_key=KEY) == "https://sky.example/dashboard/clusters/npa-c%201"
    assert "dashboard_url_template" in caplog.text


@pytest.mark.parametrize("value", [None, [], _burst_handle(cluster=""), _burst_handle(endpoint=None), {"cluster": "c"}])
def test_burst_link_is_empty_without_a_cluster_and_an_endpoint(monkeypatch, value):
    _xcom(monkeypatch, {xcom_keys.BURST_JOB: value})
    assert links.BurstJobLink().get_link(None, ti_key=KEY) == ""


def test_extra_value_returns_a_non_blank_string_only(monkeypatch):
    read = _extras(monkeypatch, {"c": {"s": "x", "blank": "  ", "num": 3, "lst": ["x"]}})
    assert links._extra_value("c", "s") == "x"
    assert links._extra_value("c", "blank") is None
    assert links._extra_value("c", "num") is None
    assert links._extra_value("c", "lst") is None
    assert links._extra_value("c", "absent") is None
    assert read == ["c"] * 5


def test_extra_value_never_raises_and_skips_an_empty_conn_id(monkeypatch):
    read = _extras(monkeypatch, {})
    assert links._extra_value("missing", "job_url_template") is None  # the lookup raised
    assert links._extra_value(None, "job_url_template") is None
    assert links._extra_value("", "job_url_template") is None
    assert read == ["missing"]


def test_a_live_operator_s_link_comes_from_its_own_job_without_asking_xcom(monkeypatch):
    """Airflow computes links in the task's process with the live operator: a step that submitted nothing (a
    conversion that reused its image) asks for no XCom, whose absence Airflow's client would log as an error."""
    from npa_airflow.slurm.operators import SlurmSqshConvertOperator

    monkeypatch.setattr(links.XCom, "get_value", staticmethod(lambda key, ti_key: pytest.fail("asked XCom")))
    monkeypatch.setattr(links, "_job_url_template", lambda conn_id: "https://site/job/{job_id}")
    op = SlurmSqshConvertOperator(task_id="convert", image="nvcr.io/nvidia/pytorch:24.01-py3")
    assert links.SlurmJobLink().get_link(op, ti_key=KEY) == ""
    from npa_airflow.slurm.handle import SlurmJobHandle

    op.this_try(context()).handle = SlurmJobHandle.from_dict(handle_dict())
    assert links.SlurmJobLink().get_link(op, ti_key=KEY) == "https://site/job/101"
