"""Long training on a short partition: Slurm warns the job before its time limit, the training writes a checkpoint
and exits 0, and the next run resumes from it.

Runs as-is on the local test clusters (`dev/cluster up`, partition `cpu`). Each run has a 6-minute limit; Slurm
sends SIGUSR1 120 s before it (up to 60 s earlier), the training saves its step next to the results root and the
job ends COMPLETED instead of TIMEOUT. Trigger the DAG again to continue from the checkpoint: the training is done
after TOTAL_STEPS steps (one a second), in its second run. Its output is in the task log.

On a GPU cluster, switch to e.g.:
    partition="gpu", gpus_per_node=8, time_hours=4, checkpoint_signal="USR1@900", image="/lustre/images/pytorch.sqsh",
    command="trap '' USR1; torchrun ... train.py"
(the warning must come before the child timeout: 720 s before the end of a 4 h job by default; torchrun's agent must
ignore the signal, its workers' Python handlers catch it). See the README's "Checkpoint warning".

The Slurm connection `slurm_default` gives the login host(s), user, key and results root.
"""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

TOTAL_STEPS = 400

# The training: resumes from its checkpoint, records a warning from Slurm (or a SIGTERM: a preemption, a cancel) in
# its handler, and at the next step boundary saves the checkpoint atomically and exits 0. The checkpoint lives on
# shared storage every run reads: next to the results root, not in this try's own results dir.
TRAIN = f"""\
python3 - "$(dirname "$NPA_RESULTS_DIR")/checkpoints/slurm_checkpoint.json" <<'PY'
import json, os, signal, sys, time

path, total = sys.argv[1], {TOTAL_STEPS}


def save(step):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(dict(step=step), f)
    os.replace(path + ".tmp", path)


stop = []
for name in (os.environ["NPA_CHECKPOINT_SIGNAL"], "TERM"):
    signal.signal(getattr(signal, "SIG" + name), lambda signum, frame: stop.append(signum))
step = json.load(open(path))["step"] if os.path.exists(path) else 0
print("resuming at step", step, "of", total, flush=True)
while step < total:
    time.sleep(1)  # one training step
    step += 1
    if stop:
        save(step)
        ahead = os.environ["NPA_CHECKPOINT_SECONDS"]
        print("warned", ahead, "s before the limit: checkpoint at step", step, flush=True)
        sys.exit(0)
save(step)
print("training complete:", total, "steps", flush=True)
PY"""

with DAG(
    dag_id="slurm_checkpoint",
    schedule=None,
    catchup=False,
    tags=["npa", "slurm", "example"],
) as dag:
    SlurmSubmitOperator(
        task_id="train",
        slurm_conn_id="slurm_default",
        partition="cpu",
        gpus_per_node=0,  # the CPU test cluster
        cpus_per_task=1,
        time_hours=0.1,  # a 6-minute limit: the child timeout stops the command 18 s before it
        checkpoint_signal="USR1@120",
        command=TRAIN,
        poll_interval=5,
    )
