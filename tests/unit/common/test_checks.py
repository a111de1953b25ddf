"""fullmatch_or_raise and field_mismatch: the checks the validators of names, ids and handles share."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from npa_airflow.common.checks import field_mismatch, fullmatch_or_raise
from npa_airflow.exceptions import NpaValidationError

JOB_ID = re.compile(r"[0-9]+")


def test_a_full_match_returns_the_value_unchanged():
    assert fullmatch_or_raise("12345", JOB_ID, "bad job id") == "12345"


@pytest.mark.parametrize("value", ["12a", "a12", " 12", "12\n", "", "1 2"])
def test_a_partial_match_is_refused(value):
    with pytest.raises(NpaValidationError, match=r"^bad job id$"):
        fullmatch_or_raise(value, JOB_ID, "bad job id")


@pytest.mark.parametrize("value", [12, None, b"12", ["12"]])
def test_a_value_that_is_not_a_string_is_refused(value):
    with pytest.raises(NpaValidationError, match="bad job id"):
        fullmatch_or_raise(value, JOB_ID, "bad job id")


@dataclass
class Record:
    a: int
    b: str
    c: str | None = None


def test_field_mismatch_of_a_matching_mapping_is_empty():
    assert field_mismatch(Record, {"a": 1, "b": "x"}, ["a", "b"]) == ([], [])


def test_field_mismatch_names_unknown_keys_sorted_and_missing_required_in_order():
    unknown, missing = field_mismatch(Record, {"zz": 1, "c": None, "aa": 2}, ["b", "a"])
    assert unknown == ["aa", "zz"]
    assert missing == ["b", "a"]


def test_field_mismatch_accepts_an_instance_and_optional_fields():
    assert field_mismatch(Record(1, "x"), {"a": 1, "b": "x", "c": "y"}, ["a"]) == ([], [])


def test_field_mismatch_refuses_a_type_that_is_not_a_dataclass():
    with pytest.raises(TypeError):
        field_mismatch(dict, {}, [])
