"""The burst launcher: a bash script (``templates/burst/launcher.sh.j2``) that becomes the task's ``run``.

It derives the torchrun rendezvous from SkyPilot's node environment (``SKYPILOT_NODE_RANK``, the first
line of ``SKYPILOT_NODE_IPS`` as master, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE``), exports
``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``, and execs torchrun; it fails with an
explicit message when torchrun is missing in the image.
"""

from __future__ import annotations

from npa_airflow.burst.task import BurstSpec, command_argv, torchrun_target
from npa_airflow.common.templates import template_env

LAUNCHER_TEMPLATE = "burst/launcher.sh.j2"


def render_launcher(spec: BurstSpec) -> str:
    """The launcher script for ``spec`` (pure; the command is validated and every argument quoted)."""
    no_python, argv = torchrun_target(command_argv(spec.command))
    template = template_env().get_template(LAUNCHER_TEMPLATE)
    return template.render(image=spec.image, master_port=int(spec.master_port), no_python=no_python, argv=argv)
