"""Where the control-plane programs live: built from their Go modules by `tools/gobuild.sh` (make testbins) into a
cache outside the checkout, one folder per program and version, with the versions pinned in tools/versions.env."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "tools" / "versions.env"
# program -> (the versions.env key of its version, the binaries it provides)
PROGRAMS = {
    "kubernetes": ("KUBERNETES_VERSION", ("kube-apiserver", "kube-controller-manager", "kube-scheduler")),
    "etcd": ("ETCD_VERSION", ("etcd",)),
    "kwok": ("KWOK_VERSION", ("kwok",)),
}


@cache
def versions() -> dict[str, str]:
    """tools/versions.env, where a version set in the environment wins (`make test-cluster KUBERNETES_VERSION=1.35.8`
    exports it), as tools/gobuild.sh reads it."""
    out: dict[str, str] = {}
    for line in VERSIONS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = os.environ.get(key.strip()) or value.strip()
    return out


def cache_dir() -> Path:
    if os.environ.get("GPUSHARE_BIN_CACHE"):
        return Path(os.environ["GPUSHARE_BIN_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gpushare" / "bin"


@dataclass(frozen=True)
class Binaries:
    folder: dict[str, Path]  # binary name -> its path

    def __getitem__(self, name: str) -> str:
        return str(self.folder[name])

    @property
    def kubernetes_version(self) -> str:
        """The release these Kubernetes binaries were built from ("1.37.2")."""
        return self.folder["kube-apiserver"].parent.name.removeprefix("kubernetes-")


def program_dir(program: str) -> Path:
    key, _ = PROGRAMS[program]
    return cache_dir() / f"{program}-{versions()[key]}"


def find() -> tuple[Binaries | None, str]:
    """The built binaries, or None and what to run to build them."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for program, (_, names) in PROGRAMS.items():
        folder = program_dir(program)
        for name in names:
            path = folder / name
            if (folder / ".built").exists() and path.exists():
                found[name] = path
            else:
                missing.append(f"{name} ({folder})")
    if missing:
        return None, (f"control-plane binaries not built: {', '.join(missing)}; run `make testbins` "
                      "(needs Go 1.24+ and the Go module proxy)")
    return Binaries(found), ""
