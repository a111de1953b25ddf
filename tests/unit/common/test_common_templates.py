"""templates_dir() (checkout vs installed wheel) and the strict Jinja2 environment."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

from npa_airflow.common import templates


def test_templates_dir_in_checkout_is_the_repo_templates():
    repo = Path(__file__).resolve().parents[3]
    assert templates.templates_dir() == repo / "templates"


def test_templates_dir_prefers_the_wheel_location(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "npa_airflow"
    (package / "templates" / "slurm").mkdir(parents=True)
    monkeypatch.setattr(templates, "_PACKAGE_DIR", package)
    assert templates.templates_dir() == package / "templates"


def test_templates_dir_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(templates, "_PACKAGE_DIR", tmp_path / "nowhere" / "npa_airflow")
    with pytest.raises(FileNotFoundError, match="no templates directory"):
        templates.templates_dir()


def test_environment_is_strict_unescaped_and_quotes():
    env = templates.template_env()
    tpl = env.from_string("echo {{ v | q }} <{{ raw }}>\n")
    assert tpl.render(v="it's $(x)", raw="&") == "echo 'it'\"'\"'s $(x)' <&>\n"
    with pytest.raises(jinja2.UndefinedError):
        tpl.render(v="x")


# Values a template may put inside double quotes: integers the renderers validate (never user text).
_INTEGERS_IN_DOUBLE_QUOTES = {"timeout_seconds"}


def _interpolations_in_double_quotes(line: str) -> list[str]:
    """The ``{{ ... }}`` expressions of one shell line that sit inside a double-quoted string."""
    found, quote, i = [], "", 0
    while i < len(line):
        if line.startswith("{{", i):
            end = line.index("}}", i)
            if quote == '"':
                found.append(line[i + 2 : end].strip())
            i = end + 2
            continue
        char = line[i]
        if char == "\\" and quote != "'":
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif char == "#" and not quote and (i == 0 or line[i - 1] in " \t"):
            break  # a comment: not shell
        i += 1
    return found


def test_no_template_puts_a_value_inside_double_quotes():
    """`"...{{ x | q }}..."` still runs the `$(...)` in x: quote into a variable first, then use "${var}"."""
    offenders = []
    for path in sorted(templates.templates_dir().rglob("*.j2")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            shell = re.sub(r"\{%.*?%\}", "", line)
            for expr in _interpolations_in_double_quotes(shell):
                if expr not in _INTEGERS_IN_DOUBLE_QUOTES:
                    offenders.append(f"{path.name}:{number}: {expr}")
    assert offenders == []


def test_the_audit_sees_a_quoted_value_inside_double_quotes():
    assert _interpolations_in_double_quotes("echo \"a {{ v | q }}\" {{ w | q }} '{{ s }}'") == ["v | q"]
    assert _interpolations_in_double_quotes('echo "x" # "{{ c }}"') == []
