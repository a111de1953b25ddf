"""checkpoint_signal on the real local cluster: Slurm's warning reaches the command, which "checkpoints" and exits 0
before the time limit, so the job ends COMPLETED, not TIMEOUT.

The beds run ProctrackType=proctrack/linuxproc: Slurm signals every process of the step, the task (npa_task) and
the command alike, and the task passes the signal on as well (what a cgroup site needs: there only the task gets it;
the unit tests run both ways). With an image, the Pyxis stand-in (tests/standins/srun) checks the image and execs
the real srun: the step's processes are the same as without one, so the signal reaches them the same way. A real
Pyxis step's tasks are the container's processes, signalled like any task's.
"""

from __future__ import annotations

import re
import uuid

import pytest

from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, task_context
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.slurm_accounting import accounted_jobs

pytestmark = pytest.mark.integration

LIMIT_SECONDS = 120  # time_hours=2/60: #SBATCH --time=2
# A training loop's stand-in: it waits (a bash `wait` is interrupted by a trapped signal, a foreground sleep is not)
# until the warning, then "writes a checkpoint" and exits 0. Slurm sends the warning 60 s before the limit, or up
# to 60 s earlier; the child timeout (114 s) would end it with 124 if no warning came. The sleep ignores the
# signal: Slurm signals every process of the step, and a sleep killed by it ended the `wait` before bash ran its
# trap (once in CI, on a loaded machine).
COMMAND = """\
echo "npa-test: started in ${NPA_STANDIN_CONTAINER_IMAGE:-no image}"
on_warning() {
  echo "npa-test: got $NPA_CHECKPOINT_SIGNAL, $NPA_CHECKPOINT_SECONDS s before the limit, after $SECONDS s"
  exit 0
}
trap on_warning USR1
(trap '' USR1; exec sleep 300) &
wait
echo "npa-test: no warning came"
exit 3"""
GOT = re.compile(r"^npa-test: got USR1, 60 s before the limit, after (\d+) s$", re.M)


@pytest.mark.parametrize("in_image", [False, True], ids=["host", "image"])
def test_the_warning_reaches_the_command_which_ends_the_job_before_its_limit(
    slurm_cluster, cluster_ssh, monkeypatch, request, in_image
):
    tag = uuid.uuid4().hex[:6]
    image = None
    if in_image:  # the stand-in accepts a regular file with the squashfs magic; it never enters it
        image = f"{slurm_cluster.sqsh_dir}/npa-itest-signal-{tag}.sqsh"
        cluster_ssh(f"printf hsqs > {image}", check=True)
        request.addfinalizer(lambda: cluster_ssh(f"rm -f {image}"))
    reset_pollers()
    op = make_operator(command=COMMAND, time_hours=2 / 60, checkpoint_signal="USR1@60", image=image, deferrable=False)
    logger, collected = collecting_logger(f"signal-{tag}")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    ctx = task_context(f"npa_itest_signal_{tag}")
    op.render_template_fields(ctx)
    assert "#SBATCH --signal=USR1@60\n" in op.sbatch_script and "#SBATCH --time=2\n" in op.sbatch_script

    handle = op.execute(ctx)  # returns once the job succeeded (COMPLETED and status.json); raises otherwise

    out = cluster_ssh(f"cat {handle['stdout_path']}", check=True).stdout
    err = cluster_ssh(f"cat {handle['stderr_path']}", check=True).stdout
    got = GOT.search(out)
    assert got, f"no warning line in the job's output:\n{out}\n{err}"
    assert int(got.group(1)) < LIMIT_SECONDS, out  # the warning came before the limit
    assert "npa-test: no warning came" not in out
    assert f"npa-test: started in {image or 'no image'}" in out
    assert "npa: SIGUSR1 passed on to the command" in err
    assert any(GOT.match(line) for line in collected.lines)  # streamed into the task log too
    (job,) = accounted_jobs(cluster_ssh, handle["job_name"])
    assert job["state"] == "COMPLETED", (job, out, err)
    assert cluster_ssh(f"cat {handle['results_dir']}/child_exit_code", check=True).stdout == "0\n"
