"""The burst launcher: a bash script (``templates/burst/launcher.sh.j2``) that becomes the task's ``run``.

It derives the torchrun rendezvous from SkyPilot's node environment (``SKYPILOT_NODE_RANK``, the first
line of ``SKYPILOT_NODE_IPS`` as master, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE``), exports
``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``, and execs torchrun; it fails with an
explicit message when torchrun is missing in the image.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

from npa_airflow.burst.task import BurstSpec, entrypoint_argv, torchrun_target

LAUNCHER_TEMPLATE = "burst/launcher.sh.j2"


def templates_dir() -> Path:
    """``npa_airflow/templates`` in an installed wheel, the repository's ``templates/`` in a checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "templates", package.parent / "templates"):
        if (candidate / LAUNCHER_TEMPLATE).is_file():
            return candidate
    raise FileNotFoundError(f"{LAUNCHER_TEMPLATE} not found next to {package}")


@cache
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - renders a bash script; every value goes through the `q` filter
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def render_launcher(spec: BurstSpec) -> str:
    """The launcher script for ``spec`` (pure; the entrypoint is validated and every argument quoted)."""
    no_python, argv = torchrun_target(entrypoint_argv(spec.entrypoint))
    template = _environment().get_template(LAUNCHER_TEMPLATE)
    return template.render(image=spec.image, master_port=int(spec.master_port), no_python=no_python, argv=argv)
