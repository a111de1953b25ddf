"""The worker side of a job's `secret_env`: the values are registered with this process's secrets masker before
anything the job printed is written here (the non-deferrable wait, the failure message after a deferral).
Mixed into `SlurmJobOperatorBase`; a subclass with secrets names their references in `secret_references`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook


class JobSecretsMixin:
    """Masks for the job's secret values in this process (the operator supplies the attributes declared here)."""

    log: logging.Logger
    _log_tail: Callable[[SlurmHook, SlurmJobHandle], str]
    _secrets_masked = False  # once per process: the worker that submits, the worker that completes

    def secret_references(self) -> dict[str, str]:
        """The `secret_env` references of this task's jobs ({} here): every process that writes the job's output
        resolves them and registers the values with its secrets masker first (`mask_job_secrets`)."""
        return {}

    def mask_job_secrets(self, values: Iterable[str] | None = None) -> bool:
        """Register the job's secret values (resolved now unless given) with this process's secrets masker.

        False when they could not be read: the caller then writes nothing of the job's output it read itself.
        """
        from npa_airflow.common.secret_env import mask_secret_env

        refs = self.secret_references()
        if refs and not self._secrets_masked:
            try:
                mask_secret_env(refs, values)
            except Exception as exc:
                self.log.warning("Could not read the secret_env values to mask them in this log: %s", exc)
                return False
            self._secrets_masked = True
        return True

    def _failure_tail(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any]) -> str:
        """The end of the job's output for the failure message, every secret value masked.

        Read from the cluster when this process could register the secrets, else the event's tail (which the
        trigger masked as it wrote it).
        """
        from npa_airflow.common.secret_masking import redact_text

        tail = self._log_tail(hook, handle) if self.mask_job_secrets() else ""
        return redact_text(tail or event.get("log_tail") or "")
