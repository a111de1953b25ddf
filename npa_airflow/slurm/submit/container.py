"""What a containerised step sees under Pyxis/Enroot, and the srun options that say it (pure).

Real Pyxis shows a container the image's own filesystem plus the declared ``--container-mounts`` only: a path on
shared storage that is not mounted does not exist inside (a ``mkdir -p`` there writes into the container and is
lost with it). Without ``--container-workdir`` the step starts where the image's start-up leaves it (the user's
home for a plain root filesystem), and for any name not listed in ``--container-env`` an ENV of the image wins
over the job's value. So every containerised step here:

- mounts the job's own paths (its results directory, its inputs) at the same path as on the host, before the
  user's ``container_mounts``;
- starts in an explicit working directory (the results directory unless the author names another);
- lists every variable the job exports on the host in ``--container-env``, so the job's value wins.

Mount syntax is Pyxis's: ``SRC[:DST[:FLAGS]]`` separated by commas; ``SRC`` alone mounts at the same path.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Sequence

from npa_airflow.exceptions import NpaValidationError

# Pyxis splits --container-mounts at ',' and ':', and Enroot refuses whitespace in a mount entry.
_MOUNTABLE_RE = re.compile(r"/[^,:\s]*")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def mount_target(mount: str) -> str:
    """Where ``SRC[:DST[:FLAGS]]`` appears inside the container (DST, or SRC when there is none), normalised."""
    parts = mount.split(":")
    target = parts[1] if len(parts) > 1 and parts[1] else parts[0]
    return posixpath.normpath(target)


def check_mountable(path: str, what: str) -> str:
    """``path`` normalised, or a clear error when Pyxis cannot mount it at the same path."""
    if not _MOUNTABLE_RE.fullmatch(path):
        raise NpaValidationError(
            f"{what}={path!r} cannot be mounted into the container: Pyxis separates mounts with ',' and ':' and "
            "Enroot refuses whitespace. Use a path without ',', ':' or spaces (or run without an image)"
        )
    return posixpath.normpath(path)


def _inside(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def merge_mounts(job_paths: Iterable[str], user_mounts: Sequence[str]) -> tuple[str, ...]:
    """The ``--container-mounts`` entries of a step: the job's paths at the same place, then the user's.

    - A job path inside another job path is already visible and is left out; exact duplicates appear once.
    - A user mount whose target is a job path replaces the job's mount there (the author chose what to show).
    - Entries are ordered by target depth, parents first (stable otherwise): Enroot mounts in order, and a
      parent mounted after a child would hide it.
    """
    user = list(dict.fromkeys(user_mounts))
    user_targets = {mount_target(m) for m in user}
    candidates = [p for p in dict.fromkeys(posixpath.normpath(p) for p in job_paths) if p not in user_targets]
    own = [p for p in candidates if not any(q != p and _inside(p, q) for q in candidates)]
    entries = [*own, *user]

    def depth(entry: str) -> int:
        target = mount_target(entry)
        return 0 if target == "/" else target.count("/")

    return tuple(sorted(entries, key=depth))


def env_names(names: Iterable[str]) -> tuple[str, ...]:
    """The ``--container-env`` names: each once, in the given order, validated."""
    out = tuple(dict.fromkeys(names))
    for name in out:
        if not ENV_NAME_RE.fullmatch(name):
            raise NpaValidationError(f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return out


def container_srun_options(
    image: str,
    mounts: Sequence[str],
    workdir: str,
    names: Sequence[str],
    quote: Callable[[str], str] = shlex.quote,
) -> list[str]:
    """The Pyxis options of one srun, each one shell word: every path goes through ``quote`` (by default
    ``shlex.quote``; a template may map a path it holds in a variable to that variable)."""
    options = [f"--container-image={quote(image)}"]
    if mounts:
        options.append(f"--container-mounts={','.join(quote(m) for m in mounts)}")
    options.append(f"--container-workdir={quote(workdir)}")
    if names:
        options.append(f"--container-env={','.join(env_names(names))}")
    return options
