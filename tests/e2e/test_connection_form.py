"""The connection form: `slurm` and `skypilot` show labelled fields (the provider's `conn-fields`), not raw JSON.

Checked through the endpoint the UI builds its "Add Connection" form from (GET /ui/connections/hook_meta).
"""

from __future__ import annotations

import pytest

SLURM_EXTRA_FIELDS = {
    "private_key": "Private key",
    "key_file": "Private key file",
    "known_hosts": "known_hosts",
    "host_key": "Host key",
    "insecure_skip_host_key_check": "Skip host key verification (insecure)",
    "partition": "Default GPU partition",
    "account": "Account",
    "results_root": "Results root (shared storage)",
    "cpu_partition": "CPU partition for image conversion",
    "sqsh_cache_dir": ".sqsh cache directory",
}


@pytest.fixture(scope="module")
def forms(api) -> dict[str, dict]:
    return {meta["connection_type"]: meta for meta in api.hook_meta()}


def test_slurm_form_has_labelled_fields(forms):
    meta = forms.get("slurm")
    assert meta, f"connection type 'slurm' is not offered; types: {sorted(forms)}"
    extra = meta["extra_fields"]
    labels = {name: (field.get("schema") or {}).get("title") for name, field in extra.items()}
    for name, label in SLURM_EXTRA_FIELDS.items():
        assert labels.get(name) == label, f"slurm field {name!r}: label {labels.get(name)!r}, want {label!r}"
    # Secrets are password inputs, never echoed in the form.
    assert extra["private_key"]["schema"].get("format") == "password"
    # Host key verification is on unless switched off explicitly.
    assert extra["insecure_skip_host_key_check"]["value"] is False
    std = meta["standard_fields"]
    assert std["host"]["title"].startswith("Login host")
    assert std["login"]["title"] == "Cluster user"
    assert std["password"]["title"] == "Key passphrase"


def test_skypilot_form_has_labelled_fields(forms):
    meta = forms.get("skypilot")
    assert meta, f"connection type 'skypilot' is not offered; types: {sorted(forms)}"
    assert meta["standard_fields"]["host"]["title"] == "API server endpoint"
    assert meta["standard_fields"]["login"]["hidden"] is True
    extra = meta["extra_fields"]
    assert extra["token"]["schema"]["title"] == "Service-account token"
    assert extra["token"]["schema"].get("format") == "password"
    assert all((field.get("schema") or {}).get("title") for field in extra.values()), extra
