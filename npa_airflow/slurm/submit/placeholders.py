"""The ``{config_path}``, ``{job_id}`` and ``{results_dir}`` placeholders of a job's commands and environment.

``{{`` and ``}}`` are escapes for literal braces; ``${VAR}`` and ``{a,b}`` are plain shell and left alone. An
unknown ``{name}`` is an error that says how to write a literal one.
"""

from __future__ import annotations

import re

from npa_airflow.exceptions import NpaValidationError

PLACEHOLDERS = ("config_path", "job_id", "results_dir")

_PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def find_placeholders(text: str) -> set[str]:
    """Names used as ``{name}`` (``{{``/``}}`` are escapes; ``${VAR}`` and ``{a,b}`` are plain shell)."""
    return {m.group(1) for m in _PLACEHOLDER_RE.finditer(text) if m.group(1)}


def check_placeholders(text: str, field_name: str = "text") -> None:
    unknown = sorted(find_placeholders(text) - set(PLACEHOLDERS))
    if unknown:
        # An operator's text fields are Jinja templates rendered by Airflow first: a bare "{{name}}" there is
        # a Jinja expression (undefined), so the escape must pass through Jinja untouched.
        literal, escaped = "{" + unknown[0] + "}", "{{" + unknown[0] + "}}"
        raise NpaValidationError(
            f"{field_name} uses unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; the known "
            f"ones are {', '.join('{' + n + '}' for n in PLACEHOLDERS)}. For a literal {literal}, write {escaped} "
            f"in an SbatchSpec, or {{% raw %}}{escaped}{{% endraw %}} in an operator's field (Airflow renders "
            "it with Jinja first)"
        )


def bind_placeholders(
    text: str, *, config_path: str | None = None, job_id: str | None = None, results_dir: str | None = None
) -> str:
    """Replace ``{config_path}``, ``{job_id}``, ``{results_dir}``; ``{{``/``}}`` -> ``{``/``}``.

    An unknown ``{name}``, or a known one without a value, is an error.
    """
    values = {"config_path": config_path, "job_id": job_id, "results_dir": results_dir}
    check_placeholders(text)

    def substitute(m: re.Match[str]) -> str:
        token, name = m.group(0), m.group(1)
        if name is None:
            return token[0]
        value = values[name]
        if value is None:
            raise NpaValidationError(f"placeholder {{{name}}} is used in {text!r} but no {name} value was given")
        return value

    return _PLACEHOLDER_RE.sub(substitute, text)
