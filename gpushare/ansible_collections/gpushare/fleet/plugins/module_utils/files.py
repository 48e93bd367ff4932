"""Files the collection's modules write on a host: atomically (a temporary file renamed over the old one, its
directory created), and only where the content differs."""

from __future__ import annotations

import os
import tempfile


def write_if_differs(path, data, mode=0o644):
    """Write `data` (bytes) to `path` unless it already holds exactly that; True when it wrote."""
    try:
        with open(path, "rb") as handle:
            if handle.read() == data:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpushare.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def differs(path, data):
    """Whether `path` would change by holding `data` (bytes): absent or other content."""
    try:
        with open(path, "rb") as handle:
            return handle.read() != data
    except FileNotFoundError:
        return True
