"""Where the NVIDIA checks find NVIDIA's programs: $GPUSHARE_NVIDIA_TOOLS, then the build from NVIDIA's Go module
(tools/gobuild.sh), then PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nvidia.programs import DEVICE_PLUGIN, MIG_PARTED, TOOLS_VARIABLE, built_tool, find_tool


def _program(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", [MIG_PARTED, DEVICE_PLUGIN])
def test_the_explicit_folder_then_the_go_build_then_path(name: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_BIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TOOLS_VARIABLE, raising=False)
    on_path = _program(tmp_path / "path", name)
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_tool(name) == on_path

    built = _program(built_tool(name).parent, name)
    assert find_tool(name) == on_path, "a build without its .built stamp is unfinished"
    (built.parent / ".built").touch()
    assert find_tool(name) == built

    explicit = _program(tmp_path / "tools" / "bin", name)
    monkeypatch.setenv(TOOLS_VARIABLE, str(tmp_path / "tools"))
    assert find_tool(name) == explicit
