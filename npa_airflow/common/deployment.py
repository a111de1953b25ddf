"""Which Airflow deployment this is: the key that makes its job names and owner proofs its own.

Several deployments (staging and prod, or two teams) often share one cluster account, and their task instances
have the same dag_id, task_id and run_id (scheduled run ids are the same everywhere). So every job name is keyed
by the deployment (`npa_airflow.common.naming`), and every job carries a proof of its owner that only this
deployment can make (`owner_comment`, Slurm's ``--comment``).

The key is a random secret created once per metadata database, as the password of the Airflow connection
``npa_airflow_deployment``: tasks can read connections but, unlike Variables and XComs, cannot write them through
Airflow's execution API. The scheduler, triggerer and API server create it when they start (the plugin's
``on_starting``); any process with database access creates it on first use. ``[npa_airflow] deployment_id`` in
Airflow's configuration overrides it, for deployments that must share their jobs on purpose (a blue/green pair
over two databases): treat it as a secret, like the connection's password.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field

from airflow.configuration import conf
from airflow.exceptions import AirflowNotFoundException
from airflow.sdk import BaseHook

from npa_airflow.exceptions import NpaError, NpaValidationError

log = logging.getLogger(__name__)

IDENTITY_CONN_ID = "npa_airflow_deployment"
CONFIG_SECTION = "npa_airflow"
CONFIG_KEY = "deployment_id"
MIN_KEY_LENGTH = 16
_KEY_RE = re.compile(r"[\x21-\x7e]{16,256}")  # printable ASCII without spaces
# An owner proof in a job's comment: "npa1:<task-instance uuid>:<proof>".
OWNER_COMMENT_RE = re.compile(r"npa1:([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|-):([0-9a-f]{24})")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class NpaNoDeploymentIdentity(NpaError):
    """This deployment has no identity yet and this process cannot create it (no metadata database access)."""


@dataclass(frozen=True)
class Deployment:
    """One deployment's identity. ``key`` is secret; ``tag`` may be shown (it names the deployment in a comment)."""

    key: str = field(repr=False)
    created_at: float | None  # when the metadata database got its identity; None when configured
    source: str  # "config" or "connection npa_airflow_deployment"

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not _KEY_RE.fullmatch(self.key):
            raise NpaValidationError(
                f"the npa-airflow deployment identity ({self.source}) must be {MIN_KEY_LENGTH}-256 printable "
                "characters without spaces; make one with `python -c 'import secrets; print(secrets.token_hex(16))'`"
            )

    @property
    def tag(self) -> str:
        """A short public name of the deployment (it cannot be turned back into the key)."""
        return hashlib.sha256(f"npa-deployment-tag\0{self.key}".encode()).hexdigest()[:8]

    def digest(self, *parts: object, length: int) -> str:
        """A keyed digest of ``parts``: the same in every process of this deployment, unguessable elsewhere."""
        message = json.dumps(list(parts), separators=(",", ":")).encode()
        return hmac.new(self.key.encode(), message, hashlib.sha256).hexdigest()[:length]

    def owner_comment(self, job_name: str, ti_id: object | None) -> str:
        """The proof a job carries in its comment: this task-instance try of this deployment submitted it."""
        ti = _ti_text(ti_id)
        return f"npa1:{ti}:{self.digest('owner', job_name, ti, length=24)}"

    def owns(self, job_name: str | None, comment: str | None) -> bool:
        """True when ``comment`` is this deployment's proof for ``job_name`` (any try's task-instance id)."""
        match = OWNER_COMMENT_RE.fullmatch((comment or "").strip())
        if match is None or not job_name:
            return False
        expected = self.digest("owner", job_name, match.group(1), length=24)
        return hmac.compare_digest(expected, match.group(2))


def _ti_text(ti_id: object | None) -> str:
    text = str(ti_id).lower() if ti_id is not None else "-"
    return text if _UUID_RE.fullmatch(text) else "-"


def _configured_key() -> str | None:
    value = conf.get(CONFIG_SECTION, CONFIG_KEY, fallback="") or ""
    return value.strip() or None


def _from_connection() -> Deployment | None:
    try:
        conn = BaseHook.get_connection(IDENTITY_CONN_ID)
    except AirflowNotFoundException:
        return None
    try:
        created = json.loads(conn.extra or "{}").get("created_at")
    except (ValueError, AttributeError):
        created = None
    created_at = float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else None
    return Deployment(conn.password or "", created_at, f"connection {IDENTITY_CONN_ID}")


def ensure_identity() -> bool:
    """Create this metadata database's identity if it has none (needs database access); True if created here.

    Two processes creating it at once cannot both win: the connection id is unique, the loser reads the winner's.
    """
    if _configured_key() is not None:
        return False
    # Airflow internals (ORM): only the process that creates the identity needs them
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from sqlalchemy.exc import IntegrityError

    try:
        with create_session() as session:
            if session.scalar(select(Connection.id).where(Connection.conn_id == IDENTITY_CONN_ID)) is not None:
                return False
            session.add(
                Connection(
                    conn_id=IDENTITY_CONN_ID,
                    conn_type="generic",
                    description="npa-airflow: this deployment's identity (keys job names and owner proofs). "
                    "Changing or deleting it orphans running jobs: see the npa-airflow README.",
                    password=secrets.token_hex(16),
                    extra=json.dumps({"created_at": time.time()}),
                )
            )
    except IntegrityError:
        return False
    log.info("Created this deployment's npa-airflow identity (connection %s)", IDENTITY_CONN_ID)
    return True


@functools.lru_cache(maxsize=1)
def current_deployment() -> Deployment:
    """This deployment's identity: ``[npa_airflow] deployment_id``, else the connection, created if missing."""
    configured = _configured_key()
    if configured is not None:
        return Deployment(configured, None, f"[{CONFIG_SECTION}] {CONFIG_KEY}")
    found = _from_connection()
    if found is None:
        try:
            ensure_identity()
        except Exception as exc:
            raise NpaNoDeploymentIdentity(
                f"this Airflow deployment has no npa-airflow identity yet (connection {IDENTITY_CONN_ID!r}) and "
                f"this process cannot create it ({type(exc).__name__}: {exc}). It is created when the scheduler, "
                "triggerer or API server starts with npa-airflow installed; or set [npa_airflow] deployment_id."
            ) from exc
        found = _from_connection()
    if found is None:
        raise NpaNoDeploymentIdentity(f"the npa-airflow identity connection {IDENTITY_CONN_ID!r} could not be read")
    return found
