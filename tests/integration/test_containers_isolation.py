"""What a containerised step sees, on the real local cluster with the isolating Pyxis/Enroot stand-ins.

The srun stand-in (tests/standins/srun) runs each task inside the image's own filesystem (bwrap), as real Pyxis
0.24 with Enroot 4.1 does (docs/reliability.md says what was checked against the real plugin). So a step here
sees only its image, its mounts and what Enroot mounts itself: a result written anywhere but a mounted path is
lost, as on a real cluster. Each assertion below would fail if the command ran on the node's host.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from npa_airflow.exceptions import NpaValidationError
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.airflow_tasks import task_context
from tests.harness.slurm_accounting import sacct_jobs

pytestmark = pytest.mark.integration

# Variables the stand-in image carries as its ENV (Docker's ENV ends up in /etc/environment under Enroot).
IMAGE_ENV = "\n".join(["NPA_IT_LISTED=image", "NPA_IT_UNLISTED=image", "NPA_IT_REF=${HOME}/from-image"])


@dataclass(frozen=True)
class Images:
    dir: str  # a scratch directory on shared storage, never mounted unless a test says so
    plain: str  # what `enroot import` makes (its /etc/rc changes to the WORKDIR, /workspace), with IMAGE_ENV
    bare: str  # a root filesystem squashed by hand: no /etc/rc, so Enroot's init leaves the step in $HOME
    devices: str  # holds /dev nodes, as a mksquashfs of a debootstrapped tree does


def ssh_once(cluster, cmd: str) -> None:
    """`cluster_ssh(cmd, check=True)` for a module-scoped fixture (cluster_ssh itself is per test)."""
    argv = [
        "ssh", "-F", "/dev/null", "-i", cluster.key_file, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={cluster.known_hosts}",
        "-p", str(cluster.port), f"{cluster.user}@{cluster.host}", cmd,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{cmd!r} exited {done.returncode}: {done.stderr}"


@pytest.fixture(scope="module")
def images(slurm_cluster) -> Iterator[Images]:
    work = f"{slurm_cluster.shared}/tests/isolation-{uuid.uuid4().hex[:8]}"
    q = shlex.quote
    ssh_once(
        slurm_cluster,
        f"set -e; mkdir -p {work}/bare/etc {work}/mnt; cd {work}; export TMPDIR=/tmp; "
        f"NPA_STANDIN_IMAGE_ENV={q(IMAGE_ENV)} enroot import -o plain.sqsh docker://registry.local#npa/iso:1; "
        "enroot import -o devices.sqsh docker://registry.local#npa/with-devices:1; "
        "printf 'PATH=/usr/bin:/bin\\n' > bare/etc/environment; "
        "mksquashfs bare bare.sqsh -all-root -noappend -quiet -no-progress",
    )
    yield Images(work, f"{work}/plain.sqsh", f"{work}/bare.sqsh", f"{work}/devices.sqsh")
    ssh_once(slurm_cluster, f"rm -rf {work}")


def probe_lines(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line and line[:1].isupper())


def test_the_srun_stand_in_shows_a_task_only_its_image_and_mounts(slurm_cluster, cluster_ssh, images):
    """Mount visibility, PATH, start directory, environment precedence and /tmp, each as real Pyxis shows them."""
    shared, cluster_bin = slurm_cluster.shared, f"{slurm_cluster.dir}/bin"
    mounted, elsewhere = f"{images.dir}/mnt", f"{images.dir}/other"
    marker = f"/tmp/npa-it-host-{uuid.uuid4().hex[:8]}"
    inside = (
        'echo "CWD=$(pwd)"; echo "PATH=$PATH"; echo "USER=$(id -un) $(id -u)"; '
        'echo "ENV=${NPA_IT_LISTED-} ${NPA_IT_UNLISTED-} ${NPA_IT_REF-} ${LANG-unset}"; '
        f'echo "SEEN=$(for p in {shared}/results {cluster_bin}/srun {marker} $HOME/.profile {mounted} /data/x; do '
        '[ -e "$p" ] && printf "%s " "$p"; done)"; '
        f'echo "TORCHRUN=$(command -v torchrun)"; echo wrote > {mounted}/from-task; '
        "echo x > /etc/npa-it 2>/dev/null && echo ROOTFS=writable || echo ROOTFS=read-only"
    )
    out = cluster_ssh(
        f"set -e; echo host > {marker}; mkdir -p {elsewhere}; echo data > {elsewhere}/x; "
        "export NPA_IT_LISTED=job NPA_IT_UNLISTED=job LANG=C.UTF-8; "
        f"srun -p cpu -N1 --container-image={images.plain} --container-env=NPA_IT_LISTED "
        f"--container-mounts={mounted},{elsewhere}:/data:ro bash -c {shlex.quote(inside)}; "
        f"rm -f {marker}; cat {mounted}/from-task",
        check=True,
    ).stdout
    seen = probe_lines(out)
    home = cluster_ssh("echo $HOME", check=True).stdout.strip()
    assert seen["CWD"] == "/workspace"  # the image's WORKDIR (Enroot's /etc/rc), not the submit directory
    assert not seen["PATH"].startswith(cluster_bin) and seen["PATH"].endswith("/usr/sbin:/usr/bin:/sbin:/bin")
    assert seen["TORCHRUN"].endswith("/bin/torchrun") and not seen["TORCHRUN"].startswith(cluster_bin)
    assert seen["USER"].split()[0] == slurm_cluster.user
    # --container-env keeps the job's value; the image's ENV wins for the rest; LANG is dropped.
    assert seen["ENV"] == f"job image {home}/from-image unset"
    # Only the mounts: not shared storage, not the cluster's tools, not the host's /tmp, not the host home.
    assert seen["SEEN"].split() == [mounted, "/data/x"]
    assert seen["ROOTFS"] == "read-only"
    assert out.strip().endswith("wrote")  # a mounted path is the host's

    # A plain root filesystem (no /etc/rc) starts in the user's home inside the container; a missing workdir
    # fails as Pyxis does; an image with device nodes cannot be unpacked by the user.
    bare = cluster_ssh(f"srun -p cpu -N1 --container-image={images.bare} sh -c 'pwd; ls -A'", check=True).stdout
    assert bare.split() == [home]  # Enroot created it in the container: empty, not the host's home
    missing = cluster_ssh(f"srun -p cpu -N1 --container-image={images.plain} --container-workdir=/nope pwd")
    assert missing.returncode == 1 and "pyxis: couldn't chdir to /nope: No such file or directory" in missing.stderr
    refused = cluster_ssh(f"srun -p cpu -N1 --container-image={images.devices} true")
    assert refused.returncode == 1
    assert "because you're not superuser!" in refused.stderr and "could not create character device" in refused.stderr
    assert f"pyxis: failed to create container filesystem for image: {images.devices}" in refused.stderr


TRAIN_PY = """\
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
out = parser.parse_args().out
os.makedirs(out, exist_ok=True)  # as training scripts do: on a path that is not mounted this writes nowhere
rank = os.environ.get("NODE_RANK", os.environ["SLURM_PROCID"])
with open(os.path.join(out, f"model-{rank}.pt"), "w") as f:
    f.write(f"weights of rank {rank}\\n")
"""


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_readme_training_shape_keeps_its_results_and_loses_what_it_writes_elsewhere(
    slurm_cluster, cluster_ssh, images, nodes
):
    """`train.py --out {results_dir}` reaches shared storage on 1 and 2 nodes; `--out` on a shared path that is
    not mounted succeeds inside the container (a writable root filesystem, as many sites configure Enroot) and
    leaves nothing on the host; a relative path lands in the working directory, the results dir."""
    code = f"{images.dir}/code-{nodes}"
    lost = f"{slurm_cluster.shared}/data/npa-it-lost-{uuid.uuid4().hex[:8]}"
    cluster_ssh(f"mkdir -p {code} && printf %s {shlex.quote(TRAIN_PY)} > {code}/train.py", check=True)
    op = make_operator(
        command=(
            f"python3 {code}/train.py --out {{results_dir}} && python3 {code}/train.py --out {lost} && "
            "echo relative > relative-${SLURM_PROCID}.txt"
        ),
        nodes=nodes,
        image=images.plain,
        container_mounts=[code],
        environment={"PYXIS_CONTAINER_WRITABLE": "1"},  # Pyxis reads it from the job's environment
        deferrable=False,
    )
    ctx = task_context(f"npa_itest_results_{nodes}_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    handle = op.execute(ctx)
    results = handle["results_dir"]
    listing = cluster_ssh(f"cd {results} && ls && cat model-*.pt; ls {lost} 2>&1 || true", check=True).stdout
    ranks = range(nodes)
    assert all(f"model-{r}.pt" in listing and f"weights of rank {r}" in listing for r in ranks), listing
    assert all(f"relative-{r}.txt" in listing for r in ranks) and "status.json" in listing
    assert "No such file or directory" in listing  # what it wrote to the unmounted path is gone


def test_an_image_with_device_nodes_is_refused_before_submission_with_the_fix(slurm_cluster, cluster_ssh, images):
    op = make_operator(command="true", image=images.devices, deferrable=False)
    ctx = task_context(f"npa_itest_devices_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    started = time.monotonic()
    with pytest.raises(NpaValidationError) as err:
        op.execute(ctx)
    message = str(err.value)
    assert message.startswith(f"image {images.devices} holds 3 device node(s) (/dev/console, /dev/loop0, /dev/null)")
    assert "mksquashfs ROOT IMAGE -noappend -ef devices.txt" in message and "-e dev" in message
    assert time.monotonic() - started < 20
    name = op.job_name_for_context(ctx)
    assert sacct_jobs(cluster_ssh, name) == []
    root = slurm_cluster.results_root
    assert cluster_ssh(f"test -e {root}/{name} || test -e {root}/sbatch/{name}.sbatch").returncode == 1
