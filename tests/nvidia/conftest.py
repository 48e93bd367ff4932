"""Fixtures for the tests that run NVIDIA's own programs (helpers in programs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nvidia.programs import DEVICE_PLUGIN, MIG_PARTED, require_tool


@pytest.fixture(scope="session")
def mig_parted() -> Path:
    return require_tool(MIG_PARTED)


@pytest.fixture(scope="session")
def device_plugin() -> Path:
    return require_tool(DEVICE_PLUGIN)
