"""The XCom keys this provider writes: one place, so the operators, triggers, links and plugin agree."""

SLURM_JOB = "slurm_job"  # the Slurm job handle (slurm/handle.py); its waiting_try tells a clear from a moved trigger
SLURM_TRY = "slurm_try"  # the waiting try as earlier versions wrote it, apart from the handle: read only for those
BURST_JOB = "burst_job"  # the Burst job handle (burst/handle.py)
TRIGGER_CLAIM = "npa_trigger_claim"  # the latest trigger's ownership claim (common/ownership.py)
BURST_LOG_LINES = "npa_burst_log_lines"  # how many lines of the Burst job's log the task log has (burst/joblog.py)
USAGE = "npa_usage"  # a Slurm or Burst job's GPU-hours: {gpus, nodes, elapsed_seconds, gpu_hours}, None when unknown
