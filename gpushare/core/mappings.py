"""Reading nested mappings as YAML, JSON or a Kubernetes object gives them, where any level may be absent, null or
of another type than the reader expects (a list or a string where a file says something else)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any


def dig(node: Any, *keys: Hashable, default: Any = None) -> Any:
    """The value at `keys` below `node`, as chained `.get()`s read it; `default` where a key is absent or a level on
    the way (`node` itself included) is not a mapping: null, a list, a string, a number. A value that is present is
    returned as it is, null included, as `.get()` returns it."""
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node
