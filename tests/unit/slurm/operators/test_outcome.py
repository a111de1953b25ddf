"""classify_failure (a trigger event and a log tail to a verdict) and read_log_tail (two reads of the hook)."""

from __future__ import annotations

from npa_airflow.slurm.commands import LogChunk
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.operators.outcome import LOG_TAIL_BYTES, classify_failure, read_log_tail
from npa_airflow.slurm.triggers import make_event_payload
from tests.harness.slurm_operator_doubles import handle_dict


def _event(native: str, state: str = "ERROR", **over) -> dict:
    fields = dict(state=state, native_state=native, exit_code=1, signal=None, node_list="c[1-2]", reason=None)
    fields.update(over)
    return make_event_payload("failed", handle_dict(), f"Slurm job 101 ended {native}", log_tail="", **fields)


NAME = handle_dict()["job_name"]


def test_a_node_failure_state_is_infrastructure_and_blames_the_allocation():
    verdict = classify_failure(_event("NODE_FAIL"), NAME, "")
    assert verdict.is_infra
    assert "job state NODE_FAIL" in verdict.evidence
    assert verdict.bad_nodes == ("c1", "c2")


def test_a_plain_failure_is_the_program_with_its_exit_code():
    verdict = classify_failure(_event("FAILED", exit_code=3), NAME, "Traceback\nValueError: bad config")
    assert not verdict.is_infra
    assert verdict.evidence.startswith("job 101 ended FAILED, exit code 3")


def test_a_cancelled_job_is_not_retried():
    verdict = classify_failure(_event("CANCELLED", state="CANCELED"), NAME, "")
    assert verdict.kind == "program" and "cancelled" in verdict.evidence


def test_missing_event_fields_default_instead_of_raising():
    event = {"job_id": 101, "handle": {"job_name": "n"}}
    verdict = classify_failure(event, "n", "")
    assert verdict.kind == "program"
    assert "job 101 ended UNKNOWN" in verdict.evidence


class TailHook:
    """Serves log files from a dict {path: bytes}, as SlurmHook.tail_logs does; records each request."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[tuple[list[tuple[str, int]], int]] = []

    def tail_logs(self, requests, max_bytes=1 << 20):
        self.requests.append((list(requests), max_bytes))
        chunks = []
        for path, offset in requests:
            data = self.files.get(path)
            if data is None:
                chunks.append(LogChunk(path=path, data=b"", offset=offset, size=-1))
                continue
            piece = data[offset : offset + max_bytes]
            chunks.append(LogChunk(path=path, data=piece, offset=offset + len(piece), size=len(data)))
        return chunks


def _handle(stdout: str = "/r/main.out", stderr: str = "/r/main.err") -> SlurmJobHandle:
    return SlurmJobHandle.from_dict({**handle_dict(), "stdout_path": stdout, "stderr_path": stderr})


def test_tail_labels_stdout_and_stderr_and_strips_trailing_whitespace():
    hook = TailHook({"/r/main.out": b"step 1\nstep 2\n\n", "/r/main.err": b"boom\n"})
    assert read_log_tail(hook, _handle()) == "[stdout /r/main.out]\nstep 1\nstep 2\n[stderr /r/main.err]\nboom"
    sizes, tails = hook.requests
    assert sizes == ([("/r/main.out", 0), ("/r/main.err", 0)], 1)  # sizes first, one byte each
    assert tails == ([("/r/main.out", 0), ("/r/main.err", 0)], LOG_TAIL_BYTES)


def test_only_the_last_tail_bytes_of_a_long_log_are_read():
    big = b"x" * (LOG_TAIL_BYTES + 100) + b"\nlast line"
    hook = TailHook({"/r/main.out": big})
    text = read_log_tail(hook, _handle(stderr="/r/main.out"))
    assert text.endswith("last line")
    assert hook.requests[1] == ([("/r/main.out", len(big) - LOG_TAIL_BYTES)], LOG_TAIL_BYTES)
    assert len(text) == len("[stdout /r/main.out]\n") + LOG_TAIL_BYTES


def test_a_shared_log_file_is_read_once_and_labelled_stdout():
    hook = TailHook({"/r/all.log": b"both streams"})
    assert read_log_tail(hook, _handle("/r/all.log", "/r/all.log")) == "[stdout /r/all.log]\nboth streams"
    assert hook.requests[0] == ([("/r/all.log", 0)], 1)


def test_missing_and_empty_logs_give_an_empty_tail_without_a_second_read():
    hook = TailHook({"/r/main.err": b""})
    assert read_log_tail(hook, _handle()) == ""
    assert len(hook.requests) == 1


def test_undecodable_bytes_are_replaced():
    hook = TailHook({"/r/main.out": b"ok \xff\xfe end"})
    assert read_log_tail(hook, _handle(stderr="/r/main.out")) == "[stdout /r/main.out]\nok \ufffd\ufffd end"
