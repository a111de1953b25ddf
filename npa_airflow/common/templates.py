"""Where the Jinja2 templates live, and the one environment every renderer uses.

In an installed wheel the templates ship as ``npa_airflow/templates``; in a source checkout they are the
repository's top-level ``templates/``. Rendering is strict: an undefined variable is an error, nothing is
HTML-escaped (these are shell scripts), and the ``q`` filter shell-quotes a value.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

import jinja2

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def templates_dir() -> Path:
    """``npa_airflow/templates`` when it exists (wheel install), else the checkout's ``templates/``."""
    shipped = _PACKAGE_DIR / "templates"
    if shipped.is_dir():
        return shipped
    checkout = _PACKAGE_DIR.parent / "templates"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"no templates directory: looked for {shipped} and {checkout}")


def shell_quote(value: object) -> str:
    return shlex.quote(str(value))


@cache
def template_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - renders shell scripts; values go through the `q` filter
        keep_trailing_newline=True,
    )
    env.filters["q"] = shell_quote
    return env
