"""The one `on_previous_try` rule both backends apply to what their earlier tries left running."""

from __future__ import annotations

import pytest

from npa_airflow.common.previous_try import PreviousTries, checked_mode, on_previous_try
from npa_airflow.exceptions import NpaValidationError


def test_reattach_adopts_the_newest_live_job_and_cancels_older_ones_as_duplicates():
    assert on_previous_try("reattach", ["t1", "t2", "t3"]) == PreviousTries("t3", ("t1", "t2"))


def test_cancel_cancels_every_live_job():
    assert on_previous_try("cancel", ["t1", "t2"]) == PreviousTries(None, ("t1", "t2"))


@pytest.mark.parametrize("mode", ["reattach", "cancel"])
def test_nothing_live_starts_anew(mode):
    assert on_previous_try(mode, []) == PreviousTries(None, ())


def test_an_unknown_mode_is_refused_saying_what_the_backend_adopts():
    assert checked_mode("cancel", "job", "submitting") == "cancel"
    with pytest.raises(NpaValidationError, match=r"live job, or cancel it before submitting a new one"):
        checked_mode("adopt", "job", "submitting")
