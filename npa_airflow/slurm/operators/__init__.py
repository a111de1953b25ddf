"""The Slurm operators: one Slurm job per step of a task, and the checks and preparation around it.

- `SlurmSubmitOperator` (submit.py): one sbatch job rendered from the seed's templates, waited on.
- `SlurmPreflightOperator` (preflight.py): read-only checks of the cluster before anything is submitted.
- `SlurmEnrootCredentialsOperator` (credentials.py): registry credentials for Enroot, over SSH stdin only.
- `SlurmSqshConvertOperator` (convert.py): the image as a valid .sqsh, converted at most once by a CPU job.
- `SlurmNcclProbeOperator` (probe.py): a 2-node all-reduce, escalating knob sets, the working env cached.

`SlurmJobOperatorBase` (base.py, with submission.py) is the lifecycle they share. Importing this package in a
DAG file is cheap: heavy imports (asyncssh through the hook, the script builders) happen inside methods.
"""

from npa_airflow.slurm.operators.base import SlurmJobOperatorBase
from npa_airflow.slurm.operators.convert import SlurmSqshConvertOperator, check_sqsh
from npa_airflow.slurm.operators.credentials import (
    SlurmEnrootCredentialsOperator,
    resolve_secret_env,
    validate_secret_env,
)
from npa_airflow.slurm.operators.job import JobEnvironment, PreparedJob
from npa_airflow.slurm.operators.preflight import SlurmPreflightOperator
from npa_airflow.slurm.operators.probe import SlurmNcclProbeOperator
from npa_airflow.slurm.operators.submit import SlurmSubmitOperator

__all__ = [
    "JobEnvironment",
    "PreparedJob",
    "SlurmEnrootCredentialsOperator",
    "SlurmJobOperatorBase",
    "SlurmNcclProbeOperator",
    "SlurmPreflightOperator",
    "SlurmSqshConvertOperator",
    "SlurmSubmitOperator",
    "check_sqsh",
    "resolve_secret_env",
    "validate_secret_env",
]
