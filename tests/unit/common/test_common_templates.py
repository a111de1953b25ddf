"""templates_dir() (checkout vs installed wheel) and the strict Jinja2 environment."""

from __future__ import annotations

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
