from __future__ import annotations

from types import SimpleNamespace

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig, parse_login_hosts


def _conn(**kw):
    base = {"conn_id": "c", "host": "login1", "port": 22, "login": "u", "password": None, "extra_dejson": {}}
    base.update(kw)
    return SimpleNamespace(**base)


def test_hosts_keep_failover_order_and_ports():
    assert parse_login_hosts("a, b:2223,[::1]:2", 22) == (("a", 22), ("b", 2223), ("::1", 2))


@pytest.mark.parametrize("field", ["", " , ", "a;rm -rf /", "a:99999", "a:x"])
def test_bad_host_fields_are_refused(field):
    with pytest.raises(NpaValidationError):
        parse_login_hosts(field, 22)


def test_no_host_key_with_verification_on_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts to fall back on
    with pytest.raises(NpaValidationError, match="known_hosts or host_key"):
        SlurmConnectionConfig.from_connection(_conn())


def test_explicit_insecure_mode_is_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = SlurmConnectionConfig.from_connection(_conn(extra_dejson={"insecure_skip_host_key_check": "true"}))
    assert cfg.insecure_skip_host_key_check


def test_site_defaults_and_secrets_kept_out_of_repr(tmp_path):
    kh = tmp_path / "kh"
    kh.write_text("")
    cfg = SlurmConnectionConfig.from_connection(
        _conn(
            password="passphrase-canary",
            extra_dejson={
                "known_hosts": str(kh),
                "private_key": "KEY-CANARY",
                "partition": "gpu",
                "results_root": "/lustre/results",
                "cpu_partition": "cpu_long",
                "sqsh_cache_dir": "/lustre/sqsh",
            },
        )
    )
    assert (cfg.partition, cfg.results_root, cfg.cpu_partition, cfg.sqsh_cache_dir) == (
        "gpu",
        "/lustre/results",
        "cpu_long",
        "/lustre/sqsh",
    )
    assert "KEY-CANARY" not in repr(cfg) and "passphrase-canary" not in repr(cfg)


def test_relative_results_root_is_refused(tmp_path):
    with pytest.raises(NpaValidationError, match="absolute path"):
        SlurmConnectionConfig.from_connection(
            _conn(extra_dejson={"known_hosts": str(tmp_path), "results_root": "results"})
        )
