"""NVIDIA's Kubernetes device plugin as it reads its settings: the device list strategy (the env and the flag that
set it, every spelling it takes, and the strategies under which a container's NVIDIA_VISIBLE_DEVICES cannot widen
what the plugin allocated), how its flag parser reads its args, and the flags and env that change the resource
names it advertises GPUs under (docs/nvidia-stack.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DEVICE_LIST_ENV = "DEVICE_LIST_STRATEGY"
DEVICE_LIST_FLAG = "device-list-strategy"
# Strategies under which a container's NVIDIA_VISIBLE_DEVICES cannot widen what the plugin allocated.
SAFE_DEVICE_LIST_STRATEGIES = ("cdi-annotations", "cdi-cri", "volume-mounts")
# Settings that decide which names GPUs are advertised under.
RENAMING_FLAGS = ("mig-strategy", "config-file")  # single names MIG instances nvidia.com/gpu; another config file
RENAMING_ENV = ("MIG_STRATEGY", "CONFIG_FILE")  # the same flags as the plugin reads them from its environment


def device_list_strategies(value: Any) -> list[str]:
    """A strategy setting in any form the plugin takes (a string, a comma list with spaces, a YAML list), normalised."""
    items = value if isinstance(value, list | tuple) else [value]
    return [s.strip().lower() for item in items for s in str(item).split(",") if s.strip()]


def flag_from_args(args: Iterable[Any], name: str) -> list[str] | None:
    """The values a flag takes in the plugin's args, in every spelling its flag parser takes (-x or --x, =value or
    the value as the next item, one item holding both); a repeated flag adds up. None when the args do not set it."""
    tokens = [token for arg in args for token in str(arg).split()]
    found: list[str] | None = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, eq, value = token.lstrip("-").partition("=")
        if token.startswith("-") and flag.lower() == name:
            if not eq:
                value = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
            found = (found or []) + [value]
        i += 1
    return found


def device_list_from_args(args: Iterable[Any]) -> list[str] | None:
    """--device-list-strategy from the plugin's args (flag_from_args), normalised."""
    found = flag_from_args(args, DEVICE_LIST_FLAG)
    return None if found is None else [s for value in found for s in device_list_strategies(value)]
