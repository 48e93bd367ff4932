"""Counts in messages: `1 GPU`, `2 GPUs`, never `1 GPUs`."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """`n` and the noun, in the plural unless `n` is 1; `plural` where adding an s is wrong (`1 copy`, `2 copies`)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
