"""SlurmEnrootCredentialsOperator and secret_env: parse-time checks."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmEnrootCredentialsOperator


def test_credentials_operator_rejects_a_bad_connection_id() -> None:
    with pytest.raises(NpaValidationError, match="registry_conn_id"):
        SlurmEnrootCredentialsOperator(task_id="c", registry_conn_id="bad id")
