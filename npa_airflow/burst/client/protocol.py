"""The SkyPilot API protocol this client speaks: its versions, header names, request names and states.

The protocol's code is pure and lives beside this module: ``api_requests`` builds the requests (``build_*``),
``answers`` reads what the server answers (``parse_*``) and ``log_text`` cleans the text of logs; no I/O, no
``import sky``, nothing ever unpickled; ``transport.AsyncSkyPilotClient`` moves the bytes.

Protocol (SkyPilot 0.14 API server, API version 62): a ``POST /<operation>`` schedules a request and
answers with its id in the ``X-Skypilot-Request-ID`` header; ``GET /api/get?request_id=`` waits for it
and returns its payload (``return_value`` and ``error`` are JSON strings; ``error.object`` is a pickle we
never touch); ``GET /api/status`` reads request states without waiting; ``POST /api/cancel`` cancels
request ids (never sent without ids: a null list cancels every request of the user); ``POST /logs``
streams a job's log as text.
"""

from __future__ import annotations

from npa_airflow.common.states import JobState

# The API version whose request/response shapes this client was written and recorded against, and the
# oldest server it accepts (55: requests report WAITING; 50: launch credentials).
CLIENT_API_VERSION = 62
CLIENT_VERSION = "0.14.1"
MIN_SERVER_API_VERSION = 55
API_VERSION_HEADER = "X-SkyPilot-API-Version"
VERSION_HEADER = "X-SkyPilot-Version"
REQUEST_ID_HEADER = "X-Skypilot-Request-ID"

REQUEST_ACTIVE = ("PENDING", "WAITING", "RUNNING")
LAUNCH_REQUEST_NAME = "sky.launch"
REQUEST_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")

# SkyPilot job states (sky.skylet.job_lib.JobStatus) in the shared vocabulary.
JOB_STATES: dict[str, JobState] = {
    "INIT": JobState.PENDING,
    "PENDING": JobState.PENDING,
    "SETTING_UP": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.COMPLETE,
    "FAILED": JobState.ERROR,
    "FAILED_SETUP": JobState.ERROR,
    "FAILED_DRIVER": JobState.ERROR,
    "CANCELLED": JobState.CANCELED,
}


def interpret_job_state(native: str | None) -> JobState:
    if native is None:
        return JobState.UNKNOWN
    return JOB_STATES.get(native.upper(), JobState.UNKNOWN)
