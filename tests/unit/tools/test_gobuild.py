"""tools/gobuild.sh when the module proxy does not serve a version: it fails naming the module and version, and copies
nothing. (An empty module folder once read as the root folder: `cp -R "/." .` copied the machine into the build
folder.) A stand-in `go` answers as `go mod download -json` does for a version the proxy lacks, so nothing here
reaches the network, and a stand-in `cp` records its arguments and copies nothing, so a regression fails these tests
instead of filling the disk; the real builds are `make testbins`, `pulumi-bins` and `nvidia-bins`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

GOBUILD = ROOT / "tools" / "gobuild.sh"
# What `go mod download -json` prints for a version the proxy does not serve (exit 1), or, with "/", a module
# folder that must never be copied.
FAKE_GO = """#!/bin/sh
case "$1 $2" in
  "mod download") if [ -n "$FAKE_DIR" ]; then echo "{\\"Path\\": \\"m\\", \\"Dir\\": \\"$FAKE_DIR\\"}"; exit 0; fi
    echo '{"Path": "m", "Version": "v9.9.9", "Error": "m@v9.9.9: reading proxy/m/@v/v9.9.9.info: 404 Not Found"}'
    exit 1 ;;
  *) exit 0 ;;
esac
"""
FAKE_CP = """#!/bin/sh
echo "$@" >> "$CP_LOG"
exit 1
"""


def _run(tmp_path: Path, program: str, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "cp").write_text(FAKE_CP)
    for tool in ("go", "cp"):
        (bin_dir / tool).chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_VERSION")}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{environ['PATH']}", GPUSHARE_BIN_CACHE=str(tmp_path / "cache"),
                   CP_LOG=str(tmp_path / "cp.log"), **env)
    return subprocess.run(["sh", str(GOBUILD), program], capture_output=True, text=True, env=environ, check=False,
                          timeout=60)


@pytest.mark.parametrize(("program", "version", "module"), [
    ("kueue", {"KUEUE_VERSION": "9.9.9"}, "sigs.k8s.io/kueue@v9.9.9"),
    ("jobset", {"JOBSET_VERSION": "9.9.9"}, "sigs.k8s.io/jobset@v9.9.9"),
    ("pulumi-kubernetes", {"PULUMI_KUBERNETES_MODULE_VERSION": "v4.0.0-20990101000000-abcdefabcdef"},
     "github.com/pulumi/pulumi-kubernetes/provider/v4@v4.0.0-20990101000000-abcdefabcdef"),
    ("pulumi", {"PULUMI_VERSION": "9.9.9"}, "github.com/pulumi/pulumi/pkg/v3@v9.9.9"),
])
def test_a_version_the_proxy_lacks_fails_naming_it_and_copies_nothing(tmp_path: Path, program: str,
                                                                       version: dict[str, str], module: str) -> None:
    done = _run(tmp_path, program, **version)
    assert done.returncode != 0
    assert f"the module proxy has no {module}" in done.stderr, done.stderr
    assert not (tmp_path / "cp.log").exists(), (tmp_path / "cp.log").read_text()
    copied = [p for p in (tmp_path / "cache").rglob("*") if p.name not in {"go.mod", "go.sum", "tools.go"}]
    assert all(p.is_dir() for p in copied), copied  # the empty work and output folders only
    assert not list((tmp_path / "cache").rglob(".built"))


def test_the_root_folder_is_never_a_module_folder(tmp_path: Path) -> None:
    done = _run(tmp_path, "kueue", KUEUE_VERSION="9.9.9", FAKE_DIR="/")
    assert done.returncode != 0 and "the module proxy has no sigs.k8s.io/kueue@v9.9.9" in done.stderr, done.stderr
    assert not (tmp_path / "cp.log").exists(), (tmp_path / "cp.log").read_text()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
