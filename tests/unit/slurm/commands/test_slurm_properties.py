"""Property tests: parsers fail only with NpaParseError, and quoting survives real bash for any value."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm import commands as c
from npa_airflow.slurm.submit.scripts import render_sbatch
from npa_airflow.slurm.submit.spec import SbatchSpec

SAMPLE_LINES = [
    "15|15|COMPLETED|0:0|c2|None|5|cpu=1,node=1|npa-sample-ok",
    "18|18|CANCELLED by 1001|0:0|c1|None|5|cpu=1,node=1|x",
    "26|22_1|COMPLETED|0:0|c1|None|5|cpu=1,node=1|arr",
    "22_[1-3]|42|PENDING|JobHeldUser||wrap",
    "NPA-TAIL 0 5",
    "CLUSTER: npa",
]
noisy_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(SAMPLE_LINES) | st.text(alphabet="0123456789|_+[]-:; ABCNONE", max_size=40)).map(
        "\n".join
    ),
)


@given(noisy_text)
def test_parsers_raise_only_parse_errors(text):
    for parse in (c.parse_sacct, c.parse_squeue, c.parse_sbatch_submit, c.parse_scontrol_nodes):
        try:
            parse(text)
        except NpaParseError:
            pass
    try:
        c.parse_tail_logs(text.encode(), [("/a", 0)])
    except NpaParseError:
        pass


# NUL and CR are refused by validation (sbatch rejects scripts with DOS line breaks); everything else is data.
values = st.text(st.characters(exclude_characters="\x00\r", exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
def test_environment_values_reach_the_job_byte_for_byte(tmp_path, value):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    srun = bindir / "srun"
    srun.write_text(
        "#!/bin/bash\n# test double for srun: drop options, run the task once\n"
        'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n'
    )
    srun.chmod(0o755)
    out = tmp_path / "value"
    spec = SbatchSpec(
        job_name="j", command=f'printf %s "$V" > {out}', log_dir="/l", results_dir=str(tmp_path / "r"),
        environment={"V": value}, placeholders_bound=True,
    )  # fmt: skip
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "1", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, env=env, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert Path(out).read_bytes() == value.encode("utf-8")
