"""Commands for sbatch, sacct, squeue, scancel, scontrol and log tails: builders, parsers and their records.

No I/O here: the hook runs what :mod:`.builders` builds and reads the output with :mod:`.parsers`.
This package re-exports all of them, so callers write ``commands.build_sacct_states`` and ``commands.parse_sacct``.
"""

from npa_airflow.slurm.commands.builders import (
    DEFAULT_NAME_SEARCH_START,
    build_cancel,
    build_cancel_and_shred,
    build_find_by_name_sacct,
    build_find_by_name_squeue,
    build_partitions,
    build_sacct_states,
    build_sbatch_submit,
    build_scontrol_nodes,
    build_shred_files,
    build_squeue_states,
    build_tail_logs,
)
from npa_airflow.slurm.commands.parsers import (
    parse_exit_code,
    parse_gres_gpus,
    parse_partitions,
    parse_sacct,
    parse_sbatch_submit,
    parse_scontrol_nodes,
    parse_slurm_minutes,
    parse_squeue,
    parse_tail_logs,
)
from npa_airflow.slurm.commands.records import (
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    TAIL_END,
    TAIL_MARK,
    LogChunk,
    NodeInfo,
    PartitionInfo,
    SlurmJobInfo,
    SubmitResult,
)
from npa_airflow.slurm.commands.validation import (
    CLUSTER_RE,
    validate_cluster,
    validate_job_id,
    validate_remote_path,
)

__all__ = [
    "CLUSTER_RE",
    "DEFAULT_NAME_SEARCH_START",
    "SACCT_FIELDS",
    "SQUEUE_FIELDS",
    "SQUEUE_FORMAT",
    "TAIL_END",
    "TAIL_MARK",
    "LogChunk",
    "NodeInfo",
    "PartitionInfo",
    "SlurmJobInfo",
    "SubmitResult",
    "build_cancel",
    "build_cancel_and_shred",
    "build_find_by_name_sacct",
    "build_find_by_name_squeue",
    "build_partitions",
    "build_sacct_states",
    "build_sbatch_submit",
    "build_scontrol_nodes",
    "build_shred_files",
    "build_squeue_states",
    "build_tail_logs",
    "parse_exit_code",
    "parse_gres_gpus",
    "parse_partitions",
    "parse_sacct",
    "parse_sbatch_submit",
    "parse_scontrol_nodes",
    "parse_slurm_minutes",
    "parse_squeue",
    "parse_tail_logs",
    "validate_cluster",
    "validate_job_id",
    "validate_remote_path",
]
