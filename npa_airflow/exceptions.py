"""Errors raised by npa-airflow. Messages say what happened, to which job, and what to do."""

from __future__ import annotations


class NpaError(Exception):
    """Base class of every npa-airflow error."""


class NpaValidationError(NpaError, ValueError):
    """Bad input, found before any remote side effect."""


class NpaParseError(NpaError):
    """Output of a remote tool that could not be understood; the message quotes it."""


class NpaRemoteError(NpaError):
    """A remote command failed (non-zero exit, or no exit status at all)."""


class NpaConnectionError(NpaError):
    """No login host could be reached, or a host key did not verify."""


class NpaHostKeyError(NpaConnectionError):
    """The login host presented a key that is not in known_hosts (or a changed one)."""


class NpaAmbiguousSubmission(NpaError):
    """sbatch may or may not have created a job, and reconciliation could not decide."""


class NpaCancelFailed(NpaError):
    """A cancel that did not happen and that asking again will not make happen (e.g. the cluster does not know
    the job, or refuses the user); the message names the job and what to check."""


def cluster_did_not_answer(exc: BaseException) -> bool:
    """A failure worth waiting out: the cluster did not answer. A host key problem never is."""
    return isinstance(exc, (NpaRemoteError, NpaConnectionError)) and not isinstance(exc, NpaHostKeyError)
