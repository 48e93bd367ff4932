"""How counts and names read in messages: `1 GPU`, `2 GPUs` (never `1 GPUs`); gpu-2 before gpu-10."""

from __future__ import annotations

import re


def counted(n: int, noun: str, plural: str = "") -> str:
    """`n` and the noun, in the plural unless `n` is 1; `plural` where adding an s is wrong (`1 copy`, `2 copies`)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def name_order(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders node and host names as people number them: gpu-2 before gpu-10 (text order puts
    gpu-10 first). Digit runs compare as numbers, the rest as text."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)
