"""Secret values registered with Airflow's real secrets masker (this process's), then redacted from text."""

from __future__ import annotations

import uuid

from npa_airflow.common.secret_masking import mask_fragments, mask_values, redact_text


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def test_fragments_are_the_value_its_lines_and_the_value_without_its_final_newline():
    assert mask_fragments(["first line\r\nsecond line\n"]) == [
        "first line\r\nsecond line\n",
        "first line\r\nsecond line",
        "first line",
        "second line",
    ]
    assert mask_fragments(["", "  ", "single"]) == ["single"]
    assert mask_fragments(["same", "same"]) == ["same"]


def test_a_value_printed_with_text_around_it_is_masked():
    secret = unique("around")
    mask_values([secret])
    assert redact_text(f"HCI_API_KEY={secret}; done") == "HCI_API_KEY=***; done"


def test_each_line_of_a_multi_line_value_is_masked_where_the_job_prints_it():
    first, second = unique("pem-line-1"), unique("pem-line-2")
    mask_values([f"-----BEGIN-----\n{first}\n{second}\n-----END-----\n"])
    assert redact_text(f"  {first}") == "  ***"  # the task log gets the job's output line by line
    assert redact_text(f"{second} trailing") == "*** trailing"
    assert first not in redact_text(f"MULTI=-----BEGIN-----\n{first}\n{second}")


def test_regex_metacharacters_in_a_value_are_literal():
    secret = f"a.b*c(d)+[e]?$f^g|h\\i{{2}}-{uuid.uuid4().hex}"
    mask_values([secret])
    assert redact_text(f"x{secret}y") == "x***y"
    assert redact_text("aXb*c(d)+[e]?$f^g|h\\i{2}") == "aXb*c(d)+[e]?$f^g|h\\i{2}"  # '.' matched nothing else


async def test_the_async_registration_masks_too():
    from npa_airflow.common.secret_masking import amask_values

    secret = unique("async")
    await amask_values([secret])
    assert redact_text(secret) == "***"
