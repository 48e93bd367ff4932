"""The NVIDIA Container Toolkit's image and versions: the repository name of its image (nvcr.io/nvidia/k8s/
container-toolkit), the tag of an image reference, and the version a version string or an image tag names (the
toolkit's tags carry it: 1.18.2, v1.17.0-ubuntu20.04, 1.17.8-1)."""

from __future__ import annotations

import re

# A version inside a toolkit version or an image tag: 1.18.2, v1.17.0-ubuntu20.04 and 1.17.8-1 each name theirs.
_VERSION_IN_TAG = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")  # ASCII digits only, as spec.VERSION_PATTERN
TOOLKIT_IMAGE = "container-toolkit"  # the repository name of NVIDIA's toolkit image (nvcr.io/nvidia/k8s/...)


def toolkit_version_of(tag: str) -> str | None:
    """The toolkit version a version string or image tag names, or None where it names none (`latest`)."""
    match = _VERSION_IN_TAG.search(tag)
    return ".".join(g for g in match.groups() if g is not None) if match else None


def image_tag(image: str) -> str:
    """The tag of an image reference ("" when it has none, e.g. only a digest): registry ports are not tags."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def is_toolkit_image(image: str) -> bool:
    """Whether an image reference is NVIDIA's toolkit image (its repository name, whatever registry or mirror)."""
    return TOOLKIT_IMAGE in image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
