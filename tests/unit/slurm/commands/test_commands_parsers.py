"""Parsers of npa_airflow.slurm.commands: sbatch, sacct, squeue and scontrol output."""

from __future__ import annotations

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm import commands as c


@pytest.mark.parametrize(
    ("stdout", "job_id", "cluster"),
    [
        ("123\n", "123", None),
        ("123", "123", None),
        ("123;gpucluster\n", "123", "gpucluster"),
        ("Welcome to the cluster!\nQuota: 10 TB used\n\n456\n\n", "456", None),
        ("123_4\n", "123_4", None),
        ("123+0\n", "123+0", None),
        ("  789  \r\n", "789", None),
    ],
)
def test_parse_sbatch_submit(stdout, job_id, cluster):
    assert c.parse_sbatch_submit(stdout) == c.SubmitResult(job_id=job_id, cluster=cluster)


@pytest.mark.parametrize(
    "stdout",
    ["", "\n\n", "Submitted batch job 123\n", "123;\n", "123;bad cluster\n", "12a\n", "123\nerror: oops\n"],
)
def test_parse_sbatch_submit_rejects_and_quotes_input(stdout):
    with pytest.raises(NpaParseError) as err:
        c.parse_sbatch_submit(stdout)
    assert repr(stdout)[:20] in str(err.value)


SACCT_MIXED = """\
101|101|COMPLETED|0:0|c1|None|5|cpu=1,node=1|npa-a-t1
102|102|FAILED|7:0|c2|None|5|cpu=1,node=1|npa-b-t1
103|103|CANCELLED by 0|0:15|c1|None|5|cpu=1,node=1|npa-c-t1
104|104|CANCELLED+|0:0|c1|None|5|cpu=1,node=1|npa-d-t1
105|105|PENDING|0:0|None assigned|Priority|0||npa-e-t1
107|106_4|RUNNING|0:0|c2|None|5|cpu=1,node=1|arr
110|110+0|RUNNING|0:0|g1|None|5|cpu=1,node=1|het
111|110+1|RUNNING|0:0|g2|None|5|cpu=1,node=1|het
112|112|NODE_FAIL|0:0|g[1-2]|None|5|cpu=1,node=1|name|with|pipes
"""


def test_parse_sacct_mixed():
    infos = c.parse_sacct(SACCT_MIXED)
    assert infos["101"] == c.SlurmJobInfo(
        job_id="101", native_state="COMPLETED", state=JobState.COMPLETE, exit_code=0, signal=0,
        job_name="npa-a-t1", node_list="c1", reason=None, source="sacct", usage=c.JobUsage(0, 1, 5),
    )  # fmt: skip
    assert (infos["102"].state, infos["102"].exit_code, infos["102"].signal) == (JobState.ERROR, 7, 0)
    assert (infos["103"].native_state, infos["103"].state, infos["103"].signal) == (
        "CANCELLED", JobState.CANCELED, 15,
    )  # fmt: skip
    assert infos["104"].state is JobState.CANCELED
    pending = infos["105"]
    assert (pending.state, pending.exit_code, pending.node_list, pending.reason) == (
        JobState.PENDING, None, None, "Priority",
    )  # fmt: skip
    assert infos["106_4"].state is JobState.RUNNING
    assert infos["107"] is infos["106_4"]  # raw id alias
    assert infos["110+0"].node_list == "g1"
    # a het job asked for by its base id: one aggregate answer over its components
    assert (infos["110"].state, infos["110"].node_list) == (JobState.RUNNING, "g1,g2")
    assert infos["106"].job_id == "106" and infos["106"].state is JobState.RUNNING
    assert infos["110+1"].node_list == "g2"
    assert infos["112"].job_name == "name|with|pipes"
    assert infos["112"].node_list == "g[1-2]"


def test_parse_sacct_requeued_duplicates_last_record_wins():
    out = (
        "200|200|NODE_FAIL|0:0|g1|None|5|cpu=1,node=1|job\n200|200|REQUEUED|0:0|g1|None|5|cpu=1,node=1|job\n"
        "200|200|RUNNING|0:0|g2|None|5|cpu=1,node=1|job\n"
    )
    info = c.parse_sacct(out)["200"]
    assert (info.native_state, info.state, info.node_list) == ("RUNNING", JobState.RUNNING, "g2")


def test_parse_sacct_skips_steps_and_blank_lines():
    out = "\n300|300|FAILED|1:0|c1|None|5|cpu=1,node=1|j\n300.batch|300.batch|FAILED|1:0|c1||5|cpu=1,node=1|batch\n"
    assert list(c.parse_sacct(out)) == ["300"]
    assert c.parse_sacct("") == {}


@pytest.mark.parametrize("bad", ["1|2|3\n", "x|y|RUNNING|0:0|c1|None|5|cpu=1,node=1|n\n"])
def test_parse_sacct_rejects_and_quotes(bad):
    with pytest.raises(NpaParseError, match="sacct line"):
        c.parse_sacct(bad)


def test_parse_sacct_unknown_state_is_unknown_not_crash():
    info = c.parse_sacct("9|9|FROBNICATED|0:0|c1|None|5|cpu=1,node=1|n\n")["9"]
    assert info.state is JobState.UNKNOWN
    assert info.native_state == "FROBNICATED"


@pytest.mark.parametrize(
    ("alloc", "gpus_nodes"),
    [
        ("billing=2,cpu=2,gres/gpu=16,mem=1000M,node=2", (16, 2)),
        ("billing=16,cpu=16,gres/gpu:h100=16,mem=64G,node=2", (16, 2)),  # a site that tracks GPU types only
        ("cpu=8,gres/gpu:a100=4,gres/gpu:v100=2,node=2", (6, 2)),  # two types in one job: they add up
        ("cpu=8,gres/gpu=8,gres/gpu:h100=8,node=1", (8, 1)),  # gres/gpu tracked as well: it is the total
        ("billing=1,cpu=1,mem=8G,node=1", (0, 1)),  # no GPU
        ("", (0, 0)),  # pending: nothing allocated yet
        ("cpu=1,gres/gpu=,node=x,junk", (0, 0)),  # unreadable pairs are skipped, never guessed
    ],
)
def test_alloc_tres_gpus_and_nodes(alloc, gpus_nodes):
    assert c.parse_alloc_tres(alloc) == gpus_nodes


def test_the_state_query_reads_each_jobs_usage():
    infos = c.parse_sacct(
        "5|5|RUNNING|0:0|g[1-2]|None|480|billing=2,cpu=2,gres/gpu:h100=16,mem=1000M,node=2|train\n"
        "6|6|PENDING|0:0|None assigned|Resources|0||queued\n"
        "7|7|RUNNING|0:0|c1|None||cpu=1,node=1|odd\n"
    )
    running = infos["5"].usage
    assert running == c.JobUsage(gpus=16, nodes=2, elapsed_seconds=480)
    assert running.to_dict() == {"gpus": 16, "nodes": 2, "elapsed_seconds": 480, "gpu_hours": 16 * 480 / 3600}
    assert infos["6"].usage == c.JobUsage(0, 0, 0)  # pending: none used
    assert infos["7"].usage is None  # no ElapsedRaw: unknown, not zero


def test_usage_is_unknown_where_the_answer_says_nothing_of_it():
    """squeue, a name lookup and the combined answer of an array (separate allocations) carry no usage."""
    assert c.parse_squeue("5|5|RUNNING|None|g1|train\n")["5"].usage is None
    found = c.parse_sacct("5|5|COMPLETED|0:0|c1|None|train|1796423060|\n", c.FIND_SACCT_FIELDS)
    assert found["5"].usage is None and found["5"].submitted_at == 1796423060
    array = c.parse_sacct(
        "8|7_1|COMPLETED|0:0|c1|None|3|cpu=1,node=1|a\n7|7_2|COMPLETED|0:0|c1|None|4|cpu=1,node=1|a\n"
    )
    assert array["7_1"].usage == c.JobUsage(0, 1, 3) and array["7"].usage is None


@pytest.mark.parametrize(
    ("text", "expected"), [("7:0", (7, 0)), ("0:9", (0, 9)), ("", (None, None)), ("x", (None, None))]
)
def test_parse_exit_code(text, expected):
    assert c.parse_exit_code(text) == expected


def test_parse_squeue():
    out = (
        "CLUSTER: west\n"
        "5|5|PENDING|Resources||npa-x-t1\n"
        "6|6|RUNNING|None|c[1-2]|npa-y-t1\n"
        "7_3|9|COMPLETED|None|c1|arr\n"
        "8|8|PENDING|ReqNodeNotAvail, UnavailableNodes:g1|| a|b \n"
    )
    infos = c.parse_squeue(out)
    assert infos["5"] == c.SlurmJobInfo(
        job_id="5", native_state="PENDING", state=JobState.PENDING, exit_code=None, signal=None,
        job_name="npa-x-t1", node_list=None, reason="Resources", source="squeue",
    )  # fmt: skip
    assert infos["6"].node_list == "c[1-2]"
    assert infos["9"] is infos["7_3"]
    assert infos["8"].reason == "ReqNodeNotAvail, UnavailableNodes:g1"
    assert infos["8"].job_name == "a|b"


def test_parse_squeue_rejects_garbage():
    with pytest.raises(NpaParseError, match="squeue line"):
        c.parse_squeue("slurm_load_jobs error: Unable to contact slurm controller\n")


NODES = (
    "NodeName=c1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 State=IDLE ThreadsPerCore=1 "
    "Partitions=cpu BootTime=2026-12-02T13:00:00 Reason=none of your business [root@2026-12-02T13:01:00] "
    "Comment=(null)\n"
    "NodeName=g1 Arch=x86_64 Gres=gpu:8 State=DOWN+DRAIN Partitions=gpu,all Reason=test [root@2026-12-02T13:01:00]\n"
)


def test_parse_scontrol_nodes():
    nodes = c.parse_scontrol_nodes(NODES)
    assert nodes["c1"] == c.NodeInfo(
        name="c1", state="IDLE", partitions=("cpu",), reason="none of your business [root@2026-12-02T13:01:00]"
    )
    assert nodes["g1"].partitions == ("gpu", "all")
    assert nodes["g1"].reason == "test [root@2026-12-02T13:01:00]"
    assert c.build_scontrol_nodes() == ["scontrol", "--oneliner", "show", "nodes"]


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("UNLIMITED", None), ("4:00:00", 240), ("30", 30), ("30:30", 31), ("1-00:00:00", 1440), ("2-12", 3600),
     ("1-01:30", 1530), ("00:00:01", 1)],
)  # fmt: skip
def test_parse_slurm_minutes(text, minutes):
    assert c.parse_slurm_minutes(text) == minutes


def test_parse_partitions():
    out = (
        "PartitionName=cpu AllowGroups=ALL Default=YES MaxTime=UNLIMITED Nodes=c[1-2] State=UP TotalCPUs=4\n"
        "PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=04:00:00 Nodes=g[1-2] State=UP\n"
    )
    parts = c.parse_partitions(out)
    assert parts["cpu"] == c.PartitionInfo(name="cpu", max_time_minutes=None, default=True, state="UP", nodes="c[1-2]")
    assert parts["gpu"].max_time_minutes == 240
    assert not parts["gpu"].default
    with pytest.raises(NpaParseError):
        c.parse_partitions("garbage\n")
