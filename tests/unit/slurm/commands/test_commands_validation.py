"""Validation of job ids before they reach a remote command (npa_airflow.slurm.commands.validation)."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm import commands as c


@pytest.mark.parametrize("job_id", ["1", "123456", "123_4", "123+0"])
def test_validate_job_id_accepts(job_id):
    assert c.validate_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", ["", "abc", "123;rm -rf /", "1 2", "123_", "123_[1-5]", "-1", 123, None, "1\n"])
def test_validate_job_id_rejects(job_id):
    with pytest.raises(NpaValidationError, match="job_id="):
        c.validate_job_id(job_id)
