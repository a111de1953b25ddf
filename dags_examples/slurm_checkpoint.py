"""Long training on a short partition: Slurm warns the job before its time limit, the training writes a checkpoint,
says where it stopped in $NPA_CONTINUE_FILE and exits 0, and the task continues it in the next segment (a new Slurm
job, the same try and results dir) until the training is done.

Runs as-is on the local test clusters (`dev/cluster up`, partition `cpu`). Each segment has a 2-minute limit; Slurm
sends SIGUSR1 60 s before it (up to 60 s earlier), the training saves its step in the run's results dir and the job
ends COMPLETED instead of TIMEOUT. The training is done after TOTAL_STEPS steps (one a second), in its third or
fourth segment, all in one run of the DAG. Its output, and each segment's end, are in the task log.

On a GPU cluster, switch to e.g.:
    partition="gpu", gpus_per_node=8, time_hours=4, checkpoint_signal="USR1@900", image="/lustre/images/pytorch.sqsh",
    command="trap '' USR1; torchrun ... train.py"
(the warning must come before the child timeout: 720 s before the end of a 4 h job by default; torchrun's agent must
ignore the signal, its workers' Python handlers catch it). See the README's "Long runs".

The Slurm connection `slurm_default` gives the login host(s), user, key and results root.
"""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

TOTAL_STEPS = 150

# The training: resumes from its checkpoint, records a warning from Slurm (or a SIGTERM: a preemption, a cancel) in
# its handler, and at the next step boundary saves the checkpoint atomically, asks for the next segment and exits 0.
# The checkpoint lives in the run's results dir, which every segment of the try shares.
TRAIN = f"""\
python3 - "$NPA_RESULTS_DIR/checkpoint.json" <<'PY'
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
        with open(os.environ["NPA_CONTINUE_FILE"], "w") as f:
            f.write("step %d of %d\\n" % (step, total))
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
        time_hours=2 / 60,  # a 2-minute limit: the child timeout stops the command 6 s before it
        checkpoint_signal="USR1@60",
        max_segments=5,
        command=TRAIN,
        poll_interval=5,
    )
