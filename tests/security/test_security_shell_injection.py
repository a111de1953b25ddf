"""Shell-injection property tests: hostile strings go over REAL SSH to REAL bash and come back as data.

Every user value that reaches a remote shell is exercised with at least 1,000 generated strings (quotes,
``$()``, backticks, newlines, globs, ``;&|``, redirections, unicode, very long values). Injection payloads
all try to create one canary file; it must never exist. A positive control first proves that an unquoted
payload WOULD create it, so the canary check can fail. Strings are batched (tens per SSH command, all on
one pooled connection) so the whole module takes seconds.

NUL cannot travel through an SSH exec request or a C string: every builder must refuse it explicitly.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from npa_airflow.common.naming import JOB_NAME_RE, validate_job_name
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm import commands
from npa_airflow.slurm.submit.staging import StagedFile, build_stage
from npa_airflow.slurm.watch.poller import build_commit_offsets, build_read_offsets
from tests.harness.remote_files import put_files, read_from

pytestmark = pytest.mark.integration

# Any executed payload creates this file on the login host. /tmp: writable by the cluster user, outside
# the directories the tests write on purpose.
CANARY = f"/tmp/npa-injection-canary-{uuid.uuid4().hex[:12]}"
BATCH = 45  # strings per generated example
EXAMPLES = 25  # examples per surface: 25 x 45 = 1,125 strings
MAX_COMMAND_BYTES = 72 * 1024  # x 4/3 (the hook sends it base64-encoded) must stay below Linux's 128 KiB
# Characters that Python's str.splitlines() treats as line breaks although the shell does not.
PYTHON_ONLY_LINE_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]

_C = CANARY
INJECTIONS = [
    f"$(touch {_C})", f"`touch {_C}`", f"; touch {_C}", f"&& touch {_C}", f"|| touch {_C}", f"| touch {_C}",
    f"\ntouch {_C}\n", f"'; touch {_C}; '", f'"; touch {_C}; "', f"'\"$(touch {_C})\"'", f"> {_C}",
    f">> {_C}", f"${{IFS}}touch${{IFS}}{_C}", f"\\'; touch {_C} #", f"<(touch {_C})", f'"`touch {_C}`"',
    f"$'\\x27'; touch {_C}", f"\r\ntouch {_C}\r\n", f"& touch {_C} &", f"a=$(touch {_C})", f"{{touch,{_C}}}",
]  # fmt: skip
SHELL_NOISE = [
    "*", "?", "[a-z]", "~", "~root", "$HOME", "${PATH}", "$((6*7))", "!!", "!$", "{a,b}", "\\", "'", '"', "`",
    "$", "$'", "-e", "-n", "--", "%s", "%n", "%b", "\\0", "\\n", "#", "<<EOF", "2>&1", "\t", "  ", "=", ",",
]  # fmt: skip
HOSTILE_CHARS = "'\"`$()[]{}<>|&;*?~!#\\ \t\n\r=%^,:-"
UNICODE = "é漢字🙂\u202e\u200b\u00a0\u2028ßΩ\u0301\ufeff"

_piece = st.one_of(
    st.sampled_from(INJECTIONS),
    st.sampled_from(SHELL_NOISE),
    st.text(alphabet=HOSTILE_CHARS, max_size=12),
    st.text(alphabet=UNICODE, max_size=6),
    st.text(alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12),
)
_short = st.lists(_piece, max_size=6).map("".join)
_long = st.tuples(_piece.filter(bool), st.integers(200, 1500)).map(lambda t: (t[0] * t[1])[:6000])
HOSTILE = st.one_of(_short, _short, _short, _long)  # about one in four is long
BATCHES = st.lists(HOSTILE, min_size=BATCH, max_size=BATCH)

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each step costs an SSH round trip
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def has_line_break_or_nul(text: str) -> bool:
    return any(c in text for c in "\n\r\x00")


def quoted_size(text: str) -> int:
    return len(shlex.quote(text).encode())


def chunks(items: Sequence[str], size_of: Callable[[str], int] = quoted_size) -> Iterator[list[str]]:
    """Split into groups whose quoted size keeps one remote command under MAX_COMMAND_BYTES."""
    group: list[str] = []
    total = 0
    for item in items:
        size = size_of(item) + 64
        if group and total + size > MAX_COMMAND_BYTES:
            yield group
            group, total = [], 0
        group.append(item)
        total += size
    if group:
        yield group


def file_name(index: int, text: str) -> str:
    """A path component carrying ``text``: '/' is the separator (not data) and a name has at most 255 bytes.

    Characters that only Python's str.splitlines() treats as line breaks are replaced while defect 1
    (test_missing_path_with_unusual_line_break_is_reported_missing) is open.
    """
    name = text.replace("/", "\u2215")
    for char in PYTHON_ONLY_LINE_BREAKS:
        name = name.replace(char, "_")
    while len(name.encode()) > 180:
        name = name[:-1]
    return f"{index:04d}-{name}"


def assert_canary_absent(hook) -> None:
    result = hook.run(["test", "-e", CANARY], check=False)
    assert result.returncode == 1, f"an injected payload ran on the cluster: {CANARY} exists"


@pytest.fixture(scope="module", autouse=True)
def canary_control(pooled_hook) -> Iterator[None]:
    """Positive control: an UNQUOTED payload does create the canary, so its absence later means something."""
    pooled_hook.run(["rm", "-f", CANARY])
    pooled_hook.run("echo " + INJECTIONS[0])  # deliberately unquoted
    assert pooled_hook.run(["test", "-e", CANARY], check=False).returncode == 0, "canary control did not fire"
    pooled_hook.run(["rm", "-f", CANARY])
    yield
    assert_canary_absent(pooled_hook)
    pooled_hook.run(["rm", "-f", CANARY], check=False)


def test_argv_lists_arrive_byte_for_byte(pooled_hook):
    """``SlurmHook.run([...])``: each argument is echoed back by printf exactly as sent."""
    seen: list[str] = []

    @PROPERTY
    @given(BATCHES)
    def prop(batch: list[str]) -> None:
        for group in chunks(batch):
            result = pooled_hook.run(["printf", "%s\\0", *group])
            assert result.stdout.split(b"\0")[:-1] == [s.encode() for s in group]
        seen.extend(batch)

    prop()
    assert len(seen) >= 1000
    assert_canary_absent(pooled_hook)


def test_paths_stage_test_and_tail_as_data(pooled_hook, scratch):
    """Staged file paths (mkdir -p, mktemp, mv), ``test -e`` inputs, path checks and log tails.

    Each hostile string becomes a directory name and a file name; the file's content is the string itself.
    The file is written through the staging builder, checked with ``test -e`` (present and absent twins),
    and read back through the log-tail builder: what comes back must equal what was sent.
    """
    seen: list[str] = []
    counter = iter(range(1_000_000))

    @PROPERTY
    @given(BATCHES)
    def prop(batch: list[str]) -> None:
        base = f"{scratch}/paths-{next(counter)}"
        paths = {}
        for i, text in enumerate(batch):
            name = file_name(i, text)
            paths[f"{base}/{name}/{name}"] = text
        for group in chunks(list(paths), lambda p: 3 * len(shlex.quote(p).encode()) + len(paths[p].encode()) * 2):
            files = [StagedFile(p, paths[p].encode(), 0o600) for p in group if not has_line_break_or_nul(p)]
            refused = [p for p in group if has_line_break_or_nul(p)]
            for p in refused:
                with pytest.raises(NpaValidationError):
                    build_stage([StagedFile(p, b"x")])
                with pytest.raises(NpaValidationError):
                    build_stage([], required_paths=[p])
                with pytest.raises(NpaValidationError):
                    commands.build_tail_logs([(p, 0)], 1024)
            if not files:
                continue
            ok = [f.path for f in files]
            put_files(pooled_hook, files)
            tails = pooled_hook.tail_logs([(p, 0) for p in ok])
            assert [(c.path, c.data) for c in tails] == [(p, paths[p].encode()) for p in ok]
            absent = [p + ".absent" for p in ok]
            expected = {**dict.fromkeys(ok, True), **dict.fromkeys(absent, False)}
            assert pooled_hook.paths_exist(ok + absent) == expected
        seen.extend(batch)

    prop()
    assert len(seen) >= 1000
    assert_canary_absent(pooled_hook)


def test_offset_files_written_and_read_as_data(pooled_hook, scratch):
    """The poller's offsets builders: hostile file names and payloads are written and read back verbatim.

    Not a user value (offsets files sit next to a validated stdout path), so fewer examples than the rest.
    """
    seen: list[str] = []
    counter = iter(range(1_000_000))

    @settings(PROPERTY, max_examples=6)
    @given(BATCHES)
    def prop(batch: list[str]) -> None:
        base = f"{scratch}/offsets-{next(counter)}"
        pooled_hook.run(["mkdir", "-p", base])
        entries = [(f"{base}/{file_name(i, t)}", t) for i, t in enumerate(batch) if not has_line_break_or_nul(t)]
        payloads = dict(entries)
        size = lambda p: 4 * len(shlex.quote(p).encode()) + len(shlex.quote(payloads[p]).encode())  # noqa: E731
        for group in chunks([p for p, _ in entries], size):
            pooled_hook.run(build_commit_offsets([(p, payloads[p]) for p in group]))
            back = pooled_hook.run(build_read_offsets(group)).stdout.split(b"\0")[: len(group)]
            assert back == [payloads[p].encode() + b"\n" for p in group]
        seen.extend(batch)

    prop()
    assert len(seen) >= 250
    assert_canary_absent(pooled_hook)


def test_job_names_are_refused_or_inert(pooled_hook):
    """A job name is either refused (clear error naming it) or from the inert charset; accepted names are
    used in real ``sacct --name`` / ``squeue --name`` lookups over SSH."""
    seen: list[str] = []
    names = st.one_of(HOSTILE, st.from_regex(JOB_NAME_RE, fullmatch=True))

    accepted: list[str] = []

    @PROPERTY
    @given(st.lists(names, min_size=BATCH, max_size=BATCH))
    def prop(batch: list[str]) -> None:
        for name in batch:
            if JOB_NAME_RE.fullmatch(name):
                accepted.append(validate_job_name(name))
            else:
                with pytest.raises(NpaValidationError, match="not a valid job name"):
                    validate_job_name(name)
        seen.extend(batch)

    prop()
    assert len(seen) >= 1000
    assert accepted, "the generator produced no acceptable name"
    unused = [f"zz-none-{n}"[:128] for n in accepted]
    for start in range(0, len(unused), 200):
        assert pooled_hook.find_jobs_by_name(unused[start : start + 200]) == []
    assert_canary_absent(pooled_hook)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda s: build_stage([StagedFile("/tmp/x" + s, b"")]), id="staged-path"),
        pytest.param(lambda s: build_stage([], required_paths=["/tmp/x" + s]), id="test-e-path"),
        pytest.param(lambda s: build_stage([], mkdirs=["/tmp/x" + s]), id="mkdir-path"),
        pytest.param(lambda s: commands.build_tail_logs([("/tmp/x" + s, 0)], 10), id="tail-path"),
        pytest.param(lambda s: commands.build_sbatch_submit("/tmp/x" + s), id="sbatch-script"),
        pytest.param(lambda s: commands.build_sbatch_submit("/tmp/x", ["--comment=" + s]), id="sbatch-arg"),
        pytest.param(lambda s: validate_job_name("a" + s), id="job-name"),
    ],
)
def test_nul_is_refused_by_builders(build):
    with pytest.raises(NpaValidationError):
        build("a\x00b")


def test_nul_in_argv_is_refused_before_sending(pooled_hook):
    """An argv element with NUL would be cut short by sshd's C strings: the hook must refuse it, not send it."""
    with pytest.raises(NpaValidationError, match="NUL"):
        pooled_hook.run(["printf", "%s", "before\x00after"])


@pytest.mark.parametrize("char", PYTHON_ONLY_LINE_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_missing_path_with_unusual_line_break_is_reported_missing(pooled_hook, scratch, char):
    """``test -e`` results are read back from the remote output; a path containing a character that
    ``str.splitlines`` splits on must still be reported missing (else a missing dataset passes the check)."""
    missing = f"{scratch}/no{char}such-input"
    assert pooled_hook.paths_exist([missing]) == {missing: False}


def _collect(strategy: st.SearchStrategy, examples: int = EXAMPLES) -> list:
    """Values hypothesis generates from ``strategy`` (the checks then run in one job, not one per value)."""
    values: list = []

    @settings(PROPERTY, max_examples=examples)
    @given(strategy)
    def gather(batch: list) -> None:
        values.extend(batch)

    gather()
    return values


def _wait_done(hook, job_id: str, timeout: float = 120) -> object:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = hook.job_states([job_id]).get(job_id)
        if info is not None and info.state.is_terminal:
            return info
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


def test_environment_values_in_a_rendered_script_reach_the_job_as_data(pooled_hook, scratch):
    """>= 1,000 hostile values as SbatchSpec environment, rendered into ONE real sbatch job on the cluster;
    the job writes each variable back NUL-separated and the bytes must match."""
    from npa_airflow.slurm.submit.scripts import render_sbatch
    from npa_airflow.slurm.submit.spec import SbatchSpec

    # A CR is refused by validation (sbatch rejects scripts with DOS line breaks; see the CRLF test below):
    # generate without it, so every generated value is used.
    no_cr = _short.filter(lambda v: "\r" not in v)
    values = _collect(st.lists(no_cr, min_size=BATCH, max_size=BATCH))
    assert len(values) >= 1000
    environment = {f"NPA_V{i}": v for i, v in enumerate(values)}
    out = f"{scratch}/env-values.bin"
    names = " ".join(environment)
    spec = SbatchSpec(
        job_name=f"npa-injection-env-{uuid.uuid4().hex[:8]}",
        command=f'for n in {names}; do printf "%s\\0" "${{!n}}"; done > {out}',
        log_dir=f"{scratch}/logs", results_dir=f"{scratch}/results", partition="cpu", gpus_per_node=0,
        cpus_per_task=1, time_hours=0.05, environment=environment, placeholders_bound=True,
    )  # fmt: skip
    script_path = f"{scratch}/env.sbatch"
    submitted = pooled_hook.stage_and_submit(
        [StagedFile(script_path, render_sbatch(spec).encode(), 0o700)], script_path, mkdirs=list(spec.log_dirs)
    )
    info = _wait_done(pooled_hook, submitted.job_id)
    assert info.exit_code == 0, read_from(pooled_hook, spec.stderr_path, 0)[0][-2000:]
    (chunk,) = pooled_hook.tail_logs([(out, 0)], max_bytes=1 << 24)
    assert chunk.data.split(b"\0")[:-1] == [v.encode() for v in values]
    assert_canary_absent(pooled_hook)


def test_probe_knob_values_reach_the_probe_job_as_data(pooled_hook, scratch):
    """>= 1,000 hostile knob values rendered into ONE real probe job: the lines that print the knobs (the start
    line and the verdict) must carry them verbatim, and nothing in them may run (the canary).

    The knobs are not NCCL variables, so the collective itself is not the point: whatever its verdict (torchrun
    may be missing on the nodes), the verdict line prints the same label."""
    from npa_airflow.slurm.submit.probe import ProbeSpec, knobs_label, probe_source, render_probe_script

    one_line = _short.filter(lambda v: "\n" not in v and "\r" not in v)  # validate_env refuses line breaks
    values = _collect(st.lists(one_line, min_size=BATCH, max_size=BATCH))
    assert len(values) >= 1000
    knobs = {f"NPA_K{i}": v for i, v in enumerate(values)}
    name = f"npa-injection-probe-{uuid.uuid4().hex[:8]}"
    spec = ProbeSpec(
        job_name=name, partition="cpu", script_path=f"{scratch}/probe.py", stdout_path=f"{scratch}/{name}.out",
        stderr_path=f"{scratch}/{name}.err", nodes=1, env=knobs, timeout_seconds=30,
    )  # fmt: skip
    script_path = f"{scratch}/{name}.sbatch"
    submitted = pooled_hook.stage_and_submit(
        [
            StagedFile(script_path, render_probe_script(spec).encode(), 0o700),
            StagedFile(spec.script_path, probe_source()),
        ],
        script_path,
    )
    _wait_done(pooled_hook, submitted.job_id, timeout=180)
    (chunk,) = pooled_hook.tail_logs([(spec.stdout_path, 0)], max_bytes=1 << 24)
    lines = [line for line in chunk.data.split(b"\n") if line.startswith(b"NPA_PROBE_")]
    label = b" knobs=" + knobs_label(knobs).encode()
    assert len(lines) == 2 and lines[0].startswith(b"NPA_PROBE_START "), lines[:2]
    assert all(line.endswith(label) for line in lines), "a knob value did not arrive as data"
    assert_canary_absent(pooled_hook)


def test_secret_values_in_the_sidecar_reach_the_job_as_data(pooled_hook, scratch, monkeypatch):
    """Hostile secret values (from connections) go through the operator's mode-600 sidecar into a real job."""
    import json

    from airflow.sdk.exceptions import TaskDeferred

    from npa_airflow.slurm.operators import SlurmSubmitOperator
    from npa_airflow.slurm.submit.scripts import render_sbatch
    from npa_airflow.slurm.watch.poller import reset_pollers

    secrets = [v for v in _collect(st.lists(_short, min_size=BATCH, max_size=BATCH), 3) if len(v) >= 4][:100]
    assert len(secrets) >= 50
    names = [f"NPA_S{i}" for i in range(len(secrets))]
    out = f"{scratch}/secret-values.bin"
    op = SlurmSubmitOperator(
        task_id="hostile", partition="cpu", gpus_per_node=0, cpus_per_task=1, time_hours=0.05, poll_interval=2,
        results_root=f"{scratch}/operator",
        command=f'for n in {" ".join(names)}; do printf "%s\\0" "${{!n}}"; done > {out}',
        secret_env={n: f"conn:npa_hostile_{i}" for i, n in enumerate(names)},
    )  # fmt: skip
    import types

    ti = types.SimpleNamespace(
        dag_id="npa_injection", task_id="hostile", run_id=f"manual__{uuid.uuid4().hex[:8]}", map_index=-1,
        try_number=1, xcom_push=lambda key, value: None,
    )  # fmt: skip
    ctx = {"ti": ti}
    op.render_template_fields(ctx)
    # A value that is text of the script itself (`  mv`, `${`) is refused by the lint, rightly: the script does not
    # depend on the values, so such a value is replaced by one it cannot contain.
    script = render_sbatch(op.spec_for(pooled_hook.config, op.job_name_for_context(ctx), ()))
    secrets = [v if v not in script else f"npa-value-{i}-not-in-the-script" for i, v in enumerate(secrets)]
    for i, value in enumerate(secrets):
        monkeypatch.setenv(f"AIRFLOW_CONN_NPA_HOSTILE_{i}", json.dumps({"conn_type": "generic", "password": value}))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    handle = deferred.value.trigger.handle.to_dict()
    reset_pollers()
    info = _wait_done(pooled_hook, handle["job_id"])
    assert info.exit_code == 0, read_from(pooled_hook, handle["stderr_path"], 0)[0][-2000:]
    (chunk,) = pooled_hook.tail_logs([(out, 0)], max_bytes=1 << 24)
    assert chunk.data.split(b"\0")[:-1] == [v.encode() for v in secrets]
    assert not pooled_hook.path_exists(f"{scratch}/operator/sidecars/{handle['job_name']}.env")  # shredded
    assert_canary_absent(pooled_hook)


def test_crlf_in_an_environment_value_is_refused_before_anything_is_staged():
    """sbatch refuses a whole script that contains CRLF ("DOS line breaks"), after staging it. A value with
    CRLF must be refused by validation (or rendered without a raw CRLF), never discovered by sbatch."""
    from npa_airflow.slurm.submit.scripts import render_sbatch
    from npa_airflow.slurm.submit.spec import SbatchSpec

    try:
        spec = SbatchSpec(
            job_name="npa-crlf", command="true", log_dir="/l", results_dir="/r", environment={"V": "a\r\nb"},
            placeholders_bound=True,
        )  # fmt: skip
    except NpaValidationError as exc:
        assert "V" in str(exc)
        return
    assert "\r\n" not in render_sbatch(spec), "the rendered script carries a CRLF that sbatch will refuse"
