"""Container image references for Pyxis/Enroot, the .sqsh cache, and .sqsh validation (pure).

Pyxis treats ``--container-image`` as a squashfs file only when it starts with ``/`` or ``.``; anything else
is a registry pull inside the allocation. So a GPU job only ever gets a ``.sqsh`` path, and registry images
are converted once, on a CPU partition, to a file cached by image name.

Accepted references (what Enroot/Pyxis accept, plus the ordinary Docker form):
    /path/image.sqsh  ./image.sqsh                 a squashfs file, used as is
    registry#image:tag  docker://registry#image:tag  Enroot's form
    registry/image:tag                              Docker's form, converted to ``registry#image:tag``
    image:tag  namespace/image:tag                  Docker Hub
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from dataclasses import dataclass
from enum import Enum

from npa_airflow.exceptions import NpaParseError, NpaValidationError

SQSH_SUFFIX = ".sqsh"
DOCKER_HUB = "docker.io"

# Enroot's own grammar (docker://[USER@][REGISTRY#]IMAGE[:TAG]), tightened to Docker's rules.
_REGISTRY = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?$"
)
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MAX_FILENAME = 200


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: either a squashfs file or a registry image."""

    original: str
    sqsh_path: str | None = None
    registry: str | None = None  # None means Docker Hub
    repository: str | None = None
    tag: str = "latest"
    tag_explicit: bool = False

    @property
    def is_sqsh(self) -> bool:
        return self.sqsh_path is not None

    @property
    def is_latest(self) -> bool:
        """A registry image tagged (or defaulting to) ``latest``: its content can change under the name."""
        return not self.is_sqsh and self.tag == "latest"

    @property
    def pyxis_ref(self) -> str:
        """What ``srun --container-image`` takes: the path, or ``registry#image:tag``."""
        if self.sqsh_path is not None:
            return self.sqsh_path
        prefix = f"{self.registry}#" if self.registry else ""
        return f"{prefix}{self.repository}:{self.tag}"

    @property
    def enroot_uri(self) -> str:
        """What ``enroot import`` takes: ``docker://registry#image:tag``."""
        if self.sqsh_path is not None:
            raise NpaValidationError(f"image {self.sqsh_path!r} is already a .sqsh file; there is nothing to import")
        return f"docker://{self.pyxis_ref}"

    @property
    def cache_name(self) -> str:
        """Stable, filesystem-safe file name for the converted image (Docker Hub names fully qualified)."""
        if self.sqsh_path is not None:
            return posixpath.basename(self.sqsh_path)
        registry = (self.registry or DOCKER_HUB).lower().replace(":", "_")
        repository = self.repository or ""
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        # '+' occurs in no component, so the name maps back to exactly one reference.
        name = "+".join([registry, *repository.split("/"), self.tag])
        if len(name) + len(SQSH_SUFFIX) > _MAX_FILENAME:
            digest = hashlib.sha256(name.encode()).hexdigest()[:16]
            name = f"{name[: _MAX_FILENAME - len(SQSH_SUFFIX) - 18]}+{digest}"
        return name + SQSH_SUFFIX


def _bad(field: str, value: str, why: str, fix: str) -> NpaValidationError:
    return NpaValidationError(f"{field}={value!r}: {why}. {fix}")


def _check_path(field: str, value: str) -> None:
    if "\x00" in value or "\n" in value or "\r" in value:
        raise _bad(field, value, "contains a NUL or line break", "Use a plain path.")


def parse_image_ref(ref: str, *, field: str = "image") -> ImageRef:
    """Parse and validate an image reference; raise NpaValidationError naming the field and the fix."""
    if not isinstance(ref, str) or not ref.strip():
        raise _bad(
            field,
            str(ref),
            "is empty",
            "Give a .sqsh path or a registry image such as nvcr.io/nvidia/pytorch:24.01-py3.",
        )
    value = ref.strip()
    _check_path(field, value)

    looks_like_file = value.endswith(SQSH_SUFFIX) and ":" not in value and "#" not in value
    if value.startswith(("/", ".")) or looks_like_file:
        return _parse_sqsh(field, value)

    body = _registry_body(field, value)
    registry, rest = _split_registry(field, value, body)
    repository, tag, tag_explicit = _split_tag(field, value, rest)
    return ImageRef(original=ref, registry=registry, repository=repository, tag=tag, tag_explicit=tag_explicit)


def _registry_body(field: str, value: str) -> str:
    """The reference without its ``docker://`` scheme; refuse other schemes, whitespace, digests and users."""
    body = value
    if "://" in body:
        scheme, _, body = body.partition("://")
        if scheme != "docker":
            raise _bad(
                field,
                value,
                f"uses the scheme {scheme!r}",
                "Only docker:// registry images and .sqsh files are supported.",
            )
    if any(c.isspace() for c in body):
        raise _bad(field, value, "contains whitespace", "Remove it.")
    if "@" in body:
        if re.search(r"@sha256:", body):
            raise _bad(
                field,
                value,
                "pins a digest, which enroot import does not accept",
                "Use a tag (registry/image:tag).",
            )
        raise _bad(
            field,
            value,
            "carries a user name",
            "Put registry credentials in ~/.config/enroot/.credentials (SlurmEnrootCredentialsOperator), "
            "not in the reference.",
        )
    return body


def _split_registry(field: str, value: str, body: str) -> tuple[str | None, str]:
    """(registry host or None, the rest): enroot's ``registry#image`` or a first component with '.', ':'."""
    registry: str | None
    if "#" in body:
        registry, _, rest = body.partition("#")
        if not registry:
            raise _bad(field, value, "has an empty registry before '#'", "Write registry#image:tag or drop the '#'.")
    else:
        first, slash, remainder = body.partition("/")
        if slash and (("." in first or ":" in first) or first == "localhost"):
            registry, rest = first, remainder
        else:
            registry, rest = None, body
    if registry is not None and not _REGISTRY.match(registry):
        raise _bad(
            field,
            value,
            f"has an invalid registry host {registry!r}",
            "Use host[:port], e.g. nvcr.io or registry.local:5000.",
        )
    return registry, rest


def _split_tag(field: str, value: str, rest: str) -> tuple[str, str, bool]:
    """(repository, tag, whether the tag was written); ``latest`` when none was."""
    repository, colon, tag = rest.rpartition(":")
    if not colon or "/" in tag:
        repository, tag, tag_explicit = rest, "latest", False
    else:
        tag_explicit = True
    if not repository:
        raise _bad(field, value, "names no image", "Write registry/image:tag.")
    for component in repository.split("/"):
        if not _COMPONENT.match(component):
            raise _bad(
                field,
                value,
                f"has an invalid image path component {component!r}",
                "Image paths use lowercase letters, digits and single '.', '_' or '-' separators.",
            )
    if not _TAG.match(tag):
        raise _bad(
            field,
            value,
            f"has an invalid tag {tag!r}",
            "Tags are 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'.",
        )
    return repository, tag, tag_explicit


def _parse_sqsh(field: str, value: str) -> ImageRef:
    if not value.endswith(SQSH_SUFFIX):
        raise _bad(
            field,
            value,
            "is a path but not a .sqsh file",
            "Give the converted image, e.g. /shared/sqsh/name.sqsh.",
        )
    if not value.startswith(("/", "./")):
        raise _bad(
            field,
            value,
            "is a relative .sqsh path that Pyxis would read as a registry image",
            "Use an absolute path or prefix it with './'.",
        )
    if posixpath.basename(value) == SQSH_SUFFIX:
        raise _bad(field, value, "has no file name", "Name the .sqsh file.")
    return ImageRef(original=value, sqsh_path=value)


def normalize_image_ref(ref: str, *, field: str = "image") -> str:
    """The reference in the form Pyxis/Enroot take: the .sqsh path, or ``registry#image:tag``."""
    return parse_image_ref(ref, field=field).pyxis_ref


def is_latest(ref: str | ImageRef) -> bool:
    parsed = ref if isinstance(ref, ImageRef) else parse_image_ref(ref)
    return parsed.is_latest


def validate_cache_dir(cache_dir: str, *, field: str = "sqsh_cache_dir") -> str:
    """An absolute, normalised directory (no trailing slash)."""
    if not cache_dir or not isinstance(cache_dir, str):
        raise _bad(field, str(cache_dir), "is empty", "Set sqsh_cache_dir on the slurm connection or the operator.")
    _check_path(field, cache_dir)
    if not cache_dir.startswith("/"):
        raise _bad(
            field,
            cache_dir,
            "is not absolute",
            "Give an absolute path on shared storage, e.g. /lustre/you/sqsh.",
        )
    normalised = posixpath.normpath(cache_dir)
    if normalised in ("/", "//"):
        raise _bad(field, cache_dir, "is the filesystem root", "Use a dedicated directory on shared storage.")
    return normalised


def sqsh_path_for(ref: str | ImageRef, cache_dir: str) -> str:
    """Where the converted image lives: a .sqsh reference's own path, else ``cache_dir/<name>.sqsh``."""
    parsed = ref if isinstance(ref, ImageRef) else parse_image_ref(ref)
    if parsed.sqsh_path is not None:
        return parsed.sqsh_path
    return posixpath.join(validate_cache_dir(cache_dir), parsed.cache_name)


def require_sqsh_image(image: str, *, field: str = "image") -> str:
    """For GPU jobs: the image must be an absolute or ``./`` .sqsh path, never a registry reference."""
    parsed = parse_image_ref(image, field=field)
    if parsed.sqsh_path is None:
        raise _bad(
            field,
            image,
            "is a registry image; Pyxis would pull and convert it inside the GPU allocation",
            "Convert it first with SlurmSqshConvertOperator and pass the .sqsh path it returns.",
        )
    return parsed.sqsh_path


# --- .sqsh validation -------------------------------------------------------------------------------------


class SqshStatus(str, Enum):
    VALID = "VALID"
    MISSING = "MISSING"
    NOT_A_FILE = "NOTFILE"
    BAD_MAGIC = "BADMAGIC"
    CORRUPT = "CORRUPT"
    TRUNCATED = "TRUNCATED"
    NO_TOOL = "NOTOOL"


@dataclass(frozen=True)
class SqshCheck:
    path: str
    status: SqshStatus
    size: int | None = None
    expected_size: int | None = None

    @property
    def valid(self) -> bool:
        return self.status is SqshStatus.VALID

    def describe(self) -> str:
        what = {
            SqshStatus.VALID: "is a valid squashfs image",
            SqshStatus.MISSING: "does not exist",
            SqshStatus.NOT_A_FILE: "is not a regular file",
            SqshStatus.BAD_MAGIC: "does not start with the squashfs magic 'hsqs'",
            SqshStatus.CORRUPT: "has no valid squashfs superblock (unsquashfs -s failed)",
            SqshStatus.TRUNCATED: (
                f"is truncated: {self.size} bytes on disk, the superblock says {self.expected_size}"
            ),
            SqshStatus.NO_TOOL: "cannot be checked: unsquashfs is missing (install squashfs-tools)",
        }[self.status]
        return f"{self.path} {what}"


_MARK = "NPA_SQSH"

# One shell function, used by the login-host check and by the conversion job, so both judge alike.
# The magic is compared as hex (od) because command substitution drops NUL bytes. `unsquashfs -s` only reads
# the superblock, so a truncated file passes it; comparing the file size with the superblock's bytes_used
# (little-endian u64 at offset 40) catches that.
SQSH_CHECK_FUNCTION = f"""\
npa_sqsh_check() {{
  local p="$1" magic used size
  if [ ! -e "$p" ]; then echo "{_MARK} MISSING"; return 1; fi
  if [ ! -f "$p" ]; then echo "{_MARK} NOTFILE"; return 1; fi
  magic=$(head -c 4 "$p" | od -An -tx1 | tr -d ' \\n')
  if [ "$magic" != 68737173 ]; then echo "{_MARK} BADMAGIC"; return 1; fi
  if ! command -v unsquashfs >/dev/null 2>&1; then echo "{_MARK} NOTOOL"; return 1; fi
  if ! unsquashfs -s "$p" >/dev/null 2>&1; then echo "{_MARK} CORRUPT"; return 1; fi
  size=$(stat -c %s "$p")
  used=$(od -An -tu8 -j40 -N8 "$p" 2>/dev/null | tr -d ' \\n')
  if [ -z "$used" ] || [ "$size" -lt "$used" ]; then echo "{_MARK} TRUNCATED $size ${{used:-0}}"; return 1; fi
  echo "{_MARK} VALID $size $used"
}}
"""


def build_sqsh_validate_command(path: str) -> str:
    """A shell command that prints one ``NPA_SQSH <STATUS> ...`` line for ``path`` (always exit 0)."""
    _check_path("sqsh path", path)
    if not path.startswith("/"):
        raise _bad("sqsh path", path, "is not absolute", "Validate absolute paths on shared storage.")
    return f"{SQSH_CHECK_FUNCTION}npa_sqsh_check {shlex.quote(path)} || true"


def parse_sqsh_validation(stdout: str, path: str) -> SqshCheck:
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) >= 2 and parts[0] == _MARK:
            try:
                status = SqshStatus(parts[1])
                numbers = [int(p) for p in parts[2:4]]
            except ValueError as err:
                raise NpaParseError(f"unexpected .sqsh check output for {path}: {line!r}") from err
            size = numbers[0] if numbers else None
            expected = numbers[1] if len(numbers) > 1 else None
            return SqshCheck(path=path, status=status, size=size, expected_size=expected)
    raise NpaParseError(f"no .sqsh check result for {path} in output: {stdout[-500:]!r}")
