"""Where a job's files live on shared storage, derived from the results root and the job's name (pure).

The operators write there and the API server derives the same paths from the same two values, so that a path read
back from a handle in XCom is acted on only when it is one of these (npa_airflow.trusted_jobs).
"""

from __future__ import annotations


def results_dir(root: str, job_name: str) -> str:
    return f"{root}/{job_name}"


CONTINUE_FILE_NAME = "npa-continue"  # NPA_CONTINUE_FILE: a long run's segment that checkpointed writes it


def continue_file(results_dir: str) -> str:
    """The file by which a segment asks for the next one (`npa_airflow.slurm.operators.segments`)."""
    return f"{results_dir.rstrip('/')}/{CONTINUE_FILE_NAME}"


def script_path(root: str, job_name: str) -> str:
    """The submitted sbatch script of a training or conversion job; Airflow's cancel marker sits next to it."""
    return f"{root}/sbatch/{job_name}.sbatch"


def probe_script_path(root: str, job_name: str) -> str:
    """The NCCL probe's sbatch script, in its own results dir."""
    return f"{results_dir(root, job_name)}/probe.sbatch"


def sidecar_path(root: str, job_name: str) -> str:
    """The mode-600 secrets sidecar of a job with `secret_env`."""
    return f"{root}/sidecars/{job_name}.env"
