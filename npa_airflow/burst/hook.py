"""SkyPilotHook: the ``skypilot`` connection (an API server endpoint) and the Burst protocol's sequences over it.

The hook owns what is said to the API server and in which order (launch, launch and job status, logs, cancel,
teardown), as async methods with a sync facade, the way ``SlurmHook`` owns SSH; operators, sensors, the trigger
and the watch call these methods and never build requests themselves.

The connection's fields and how they are read: :mod:`npa_airflow.burst.connection` (``SkyPilotConnectionConfig``,
importable from here too).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from npa_airflow.burst import client as sky
from npa_airflow.burst.client import AsyncSkyPilotClient, Identity, SkyPilotClient
from npa_airflow.burst.connection import SkyPilotConnectionConfig
from npa_airflow.common.background_loop import run_sync
from npa_airflow.common.configured_hook import ConfiguredHook
from npa_airflow.common.remote_errors import skypilot_cluster_missing
from npa_airflow.common.retry import Backoff, apause
from npa_airflow.exceptions import NpaError

if TYPE_CHECKING:
    from npa_airflow.burst.client import RequestResult, ServerInfo
    from npa_airflow.burst.handle import BurstJobHandle

__all__ = ["SkyPilotConnectionConfig", "SkyPilotHook", "SubmittedLaunch"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# A failed teardown is tried this many times, 5 s then 10 s apart (no jitter: one cluster, one caller).
TEARDOWN_ATTEMPTS = 3
TEARDOWN_BACKOFF = Backoff(base=5.0, cap=10.0, jitter=0.0)
# A followed log stream silent this long is dead: the API server sends a heartbeat every 30 s (SkyPilot 0.14).
LOG_SILENCE_SECONDS = 90.0
LOG_TAIL_CHARS = 8192


@dataclass(frozen=True)
class SubmittedLaunch:
    """A launch the API server accepted: its request id and whether it brings a new cluster up."""

    request_id: str
    created_cluster: bool
    endpoint: str
    server: ServerInfo


class SkyPilotHook(ConfiguredHook[SkyPilotConnectionConfig]):
    """Talks to a SkyPilot API server over HTTP. Connection type ``skypilot``.

    :param client: an ``AsyncSkyPilotClient`` to use instead of one opened from the connection (tests, adapters).
    """

    conn_name_attr = "skypilot_conn_id"
    config_type = SkyPilotConnectionConfig
    default_conn_name = "skypilot_default"
    conn_type = "skypilot"
    hook_name = "SkyPilot API server"

    def __init__(
        self,
        skypilot_conn_id: str = default_conn_name,
        *,
        config: SkyPilotConnectionConfig | None = None,
        client: AsyncSkyPilotClient | None = None,
    ):
        super().__init__()
        self.skypilot_conn_id = skypilot_conn_id
        self._config = config
        self._given_client = client
        # One client per event loop: httpx connections belong to the loop that opened them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSkyPilotClient] = (
            weakref.WeakKeyDictionary()
        )

    @staticmethod
    def _identity(config: SkyPilotConnectionConfig) -> Identity:
        return Identity(user=config.user, config_overrides=config.config_overrides)

    def get_client(self) -> SkyPilotClient:
        """A new blocking client for this connection (the caller closes it)."""
        config = self.config
        return SkyPilotClient(config.endpoint, token=config.token, identity=self._identity(config))

    async def aget_client(self) -> AsyncSkyPilotClient:
        """A new client for this connection (the caller closes it)."""
        config = await self.aconfig()
        return AsyncSkyPilotClient(config.endpoint, token=config.token, identity=self._identity(config))

    # -- the hook's own client ---------------------------------------------------------------------------------

    async def aclient(self) -> AsyncSkyPilotClient:
        """The client the hook's methods use on the running loop (opened on first use, closed by ``aclose``)."""
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = await self.aget_client()
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> SkyPilotHook:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- launch --------------------------------------------------------------------------------------------------

    async def ahealth(self) -> ServerInfo:
        return await (await self.aclient()).health()

    async def alaunch(self, task_yaml: str, cluster: str, *, retry_until_up: bool = False) -> SubmittedLaunch:
        """Check the server, note whether ``cluster`` exists already, and schedule the launch (sent once)."""
        client = await self.aclient()
        info = await client.health()
        existing = sky.parse_clusters(await client.call(sky.build_status(client.identity, [cluster]), timeout=120))
        request = sky.build_launch(client.identity, task_yaml, cluster, retry_until_up=retry_until_up)
        request_id = await client.submit(request)
        return SubmittedLaunch(request_id, cluster not in existing, client.endpoint, info)

    async def alaunch_status(self, request_id: str) -> RequestResult | None:
        """The launch request as the server reports it now (None: unknown to the server); never waits."""
        return (await (await self.aclient()).request_statuses([request_id])).get(request_id)

    async def alaunch_result(self, request_id: str) -> RequestResult:
        """The finished launch request (waits server side, up to 2 minutes)."""
        return await (await self.aclient()).get(request_id, timeout=120)

    async def astream_launch_log(self, request_id: str) -> AsyncIterator[str]:
        async for line in (await self.aclient()).stream_lines(sky.build_request_log(request_id)):
            yield line

    # -- the job -------------------------------------------------------------------------------------------------

    async def ajob_status(self, cluster: str, job_id: int) -> str | None:
        """SkyPilot's native state of the job (None: not reported)."""
        client = await self.aclient()
        value = await client.call(sky.build_job_status(client.identity, cluster, [job_id]), timeout=120)
        return sky.parse_job_status(value, job_id)

    async def ajob_log_tail(self, cluster: str, job_id: int, lines: int = 50) -> str:
        """The last ``lines`` lines of the job's log (cleaned of terminal codes), at most ``LOG_TAIL_CHARS``."""
        client = await self.aclient()
        request = sky.build_logs(client.identity, cluster, job_id, follow=False, tail=lines)
        kept: list[str] = []
        async for raw in client.stream_lines(request):
            line = sky.clean_log_line(raw)
            if line is not None:
                kept.append(line)
        return "\n".join(kept)[-LOG_TAIL_CHARS:]

    # -- what earlier tries left (found by name) -------------------------------------------------------------

    async def aclusters(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The clusters among ``names`` that exist, with their records (one request for all names)."""
        client = await self.aclient()
        return sky.parse_clusters(await client.call(sky.build_status(client.identity, list(names)), timeout=120))

    async def alaunches(self, cluster: str) -> list[RequestResult]:
        """The launch requests the server still holds for ``cluster``, oldest first."""
        requests = (await (await self.aclient()).cluster_requests(cluster)).values()
        launches = [r for r in requests if r.name == sky.LAUNCH_REQUEST_NAME and r.cluster_name == cluster]
        return sorted(launches, key=lambda r: r.created_at or 0.0)

    async def ajobs(self, cluster: str) -> dict[int, str]:
        """{job id: native state} of every job on ``cluster``."""
        return sky.parse_queue(await self._aqueue(cluster))

    async def ajob_record(self, cluster: str, job_id: int) -> dict[str, Any] | None:
        """The job's record in the cluster's job queue (its start and end times, resources: `burst.usage`)."""
        return sky.parse_queue_record(await self._aqueue(cluster), job_id)

    async def _aqueue(self, cluster: str) -> Any:
        """The ``/queue`` answer for ``cluster``: one record a job."""
        client = await self.aclient()
        return await client.call(sky.build_queue(client.identity, cluster), timeout=120)

    async def astream_job_log(self, cluster: str, job_id: int) -> AsyncIterator[str]:
        """The job's whole log from its start, followed until the job ends, as text pieces (see
        ``client.joblog`` for what the stream carries)."""
        client = await self.aclient()
        request = sky.build_logs(client.identity, cluster, job_id, follow=True, tail=0)
        async for text in client.stream_text(request, timeout=LOG_SILENCE_SECONDS):
            yield text

    async def ajob_log_end(self, cluster: str, job_id: int) -> str:
        """The last line of a finished job's log and SkyPilot's trailer (a last line without its newline is
        glued to the trailer, which tells it apart)."""
        client = await self.aclient()
        request = sky.build_logs(client.identity, cluster, job_id, follow=False, tail=1)
        return "".join([text async for text in client.stream_text(request, timeout=LOG_SILENCE_SECONDS)])

    # -- cancel and teardown (every step tolerates "already gone"; an API error is logged, never raised) ---------

    async def acancel_and_teardown(
        self,
        handle: BurstJobHandle,
        log: logging.Logger,
        *,
        cancel: bool = True,
        teardown: bool = True,
        wait: bool = True,
    ) -> None:
        """Cancel the launch request or the job, then tear the cluster down when the handle's policy says so.

        With ``wait=False`` the job cancel and the teardown are only submitted: the API server carries them out
        on its own, which fits a caller with a short time bound (the triggerer gives ``on_kill`` 30 s; a teardown
        can take minutes).
        """
        job_id = handle.job_id
        if cancel and job_id is None:
            job_id = await self.acancel_launch(handle.request_id, log)
        if cancel and job_id is not None:
            await self.acancel_job(handle.cluster, int(job_id), log, wait=wait)
        if teardown and handle.tears_down:
            await self.ateardown(handle.cluster, log, wait=wait)
        elif teardown:
            log.info("Cluster %s kept (teardown=%s)", handle.cluster, handle.teardown)

    async def acancel_launch(self, request_id: str, log: logging.Logger) -> int | None:
        """Cancel a launch still in flight (quick requests); return the job id a finished launch created."""
        client = await self.aclient()
        launch = await _answer(client.request_statuses([request_id]))
        launch = launch.get(request_id) if isinstance(launch, dict) else None
        if launch is not None and not launch.finished:
            cancelled = await _answer(client.cancel_requests([request_id]))
            log.info("Cancelled launch request %s: %s", request_id, cancelled)
        elif launch is not None and launch.status == "SUCCEEDED":
            result = await _answer(client.get(request_id, timeout=120))
            if not isinstance(result, Exception) and isinstance(result.return_value, dict):
                return result.return_value.get("job_id")
        return None

    async def acancel_job(self, cluster: str, job_id: int, log: logging.Logger, *, wait: bool = True) -> None:
        client = await self.aclient()
        request = sky.build_cancel_job(client.identity, cluster, job_id)
        if not wait:
            answer = await _answer(client.submit(request))
            log.info("Cancel of SkyPilot job %s on cluster %s requested: %s", job_id, cluster, answer)
            return
        answer = await _answer(client.call(request, timeout=600))
        if isinstance(answer, Exception):
            log.info("Cancel of job %s on %s: %s", job_id, cluster, answer)
        else:
            log.info("Cancelled SkyPilot job %s on cluster %s", job_id, cluster)

    async def ateardown(self, cluster: str, log: logging.Logger, *, wait: bool = True) -> None:
        """Take ``cluster`` down; with ``wait``, retried and reported if it still fails."""
        client = await self.aclient()
        request = sky.build_down(client.identity, cluster)
        if not wait:
            answer = await _answer(client.submit(request))
            log.info("Teardown of cluster %s requested: %s", cluster, answer)
            return
        for attempt in range(1, TEARDOWN_ATTEMPTS + 1):
            answer = await _answer(client.call(request, timeout=600))
            if not isinstance(answer, Exception):
                log.info("Cluster %s torn down", cluster)
                return
            if skypilot_cluster_missing(getattr(answer, "error_type", None)):
                log.info("Cluster %s is already gone", cluster)
                return
            if attempt == TEARDOWN_ATTEMPTS:
                log.warning(
                    "Teardown of cluster %s failed %d times (%s); it may still hold nodes: take it down with "
                    "`sky down %s` against %s",
                    *(cluster, attempt, answer, cluster, client.endpoint),
                )
                return
            log.info("Teardown of cluster %s failed (%s); retrying", cluster, answer)
            await apause(TEARDOWN_BACKOFF.delay(attempt))

    # -- sync facade (operators and sensors run on a worker thread without a loop) --------------------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_sync(coro)

    def close(self) -> None:
        self._sync(self.aclose())

    def __enter__(self) -> SkyPilotHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> ServerInfo:
        return self._sync(self.ahealth())

    def launch(self, task_yaml: str, cluster: str, *, retry_until_up: bool = False) -> SubmittedLaunch:
        return self._sync(self.alaunch(task_yaml, cluster, retry_until_up=retry_until_up))

    def launch_status(self, request_id: str) -> RequestResult | None:
        return self._sync(self.alaunch_status(request_id))

    def launch_result(self, request_id: str) -> RequestResult:
        return self._sync(self.alaunch_result(request_id))

    def job_status(self, cluster: str, job_id: int) -> str | None:
        return self._sync(self.ajob_status(cluster, job_id))

    def job_log_tail(self, cluster: str, job_id: int, lines: int = 50) -> str:
        return self._sync(self.ajob_log_tail(cluster, job_id, lines))

    def teardown(self, cluster: str, log: logging.Logger) -> None:
        self._sync(self.ateardown(cluster, log))

    def cancel_and_teardown(self, handle: BurstJobHandle, log: logging.Logger, **kwargs: Any) -> None:
        self._sync(self.acancel_and_teardown(handle, log, **kwargs))

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self:
                info = self.health()
        except Exception as exc:
            return False, str(exc)
        return True, f"SkyPilot API server {info.version} (API version {info.api_version}) is healthy"


async def _answer(call: Coroutine[Any, Any, T]) -> T | NpaError:
    """The answer, or the provider error it raised (cancel and teardown report those and go on)."""
    try:
        return await call
    except NpaError as exc:
        return exc
