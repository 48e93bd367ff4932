"""The local apt repository the test hosts install from: fixture packages built with dpkg-deb, and Debian's own
containerd (and the few Debian packages the fixtures need), downloaded on this machine with `apt-get download`
because the test hosts have no route out.

Layout (each directory a flat repository, as NVIDIA's are):
  debian/                    the site's Debian mirror: containerd, runc, python3-yaml, python3-pynvml (NVML bindings
                             that load the driver's NVML, as a site mirrors them), gpushare-testbed-node,
                             python3-grpcio, python3-protobuf and acl (the per-process GPU exporter's)
  nvidia-container-toolkit/  nvidia-container-toolkit{,-base}, libnvidia-container{1,-tools}: 1.18.2 and 1.17.8
  cuda/                      nvidia-driver-580 (the NVML simulator), nvidia-fabricmanager-580,
                             datacenter-gpu-manager-4-{core,cuda12,cuda13}
  mig-manager/               nvidia-mig-manager (mig-parted's systemd package)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.catalog import load_catalog

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "fixture_packages"
ROOT = HERE.parents[1]

DRIVER_VERSION = "580.95.05"
DRIVER_CUDA = 13000  # R580 drivers report CUDA 13.0
TOOLKIT_VERSIONS = ("1.18.2", "1.17.8")
DCGM_VERSION = "1:4.4.1-1"
MIG_MANAGER_VERSION = "0.13.0-1"
DEBIAN_DOWNLOADS = ("containerd", "runc", "python3-yaml", "libyaml-0-2",
                    # the per-process GPU exporter's (role gpu_process_exporter): gRPC, protobuf, setfacl
                    "python3-grpcio", "python3-protobuf", "libprotobuf32", "libabsl20220623", "libc-ares2", "libre2-9",
                    "acl")

_DCGM_PLUGINS = "usr/lib/x86_64-linux-gnu/datacenter-gpu-manager-4/plugins"


@dataclass
class Package:
    name: str
    version: str
    repo: str
    description: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path in the package -> (content, mode)
    depends: list[str] = field(default_factory=list)
    postinst: str = ""
    conffiles: list[str] = field(default_factory=list)

    def add(self, path: str, source: Path | str | bytes, mode: int = 0o644) -> Package:
        data = source if isinstance(source, bytes) else (
            source.encode() if isinstance(source, str) else source.read_bytes())
        self.files[path.lstrip("/")] = (data, mode)
        return self


def simulator_tables() -> dict:
    """The simulator's MIG tables, generated from gpushare's catalog (gpushare/data/mig_profiles.yaml)."""
    models = {}
    for model in load_catalog().models.values():
        profiles = []
        taken = {p.nvml_profile_index for p in model.profiles.values() if p.nvml_profile_index is not None}
        spare = iter(i for i in range(16) if i not in taken)
        for p in model.profiles.values():
            profiles.append({
                "name": p.name, "id": p.id,
                "nvml_profile_index": p.nvml_profile_index if p.nvml_profile_index is not None else next(spare),
                "compute_slices": p.compute_slices, "memory_slices": p.memory_slices,
                "memory_mib": int((p.memory_gib or 0) * 1024), "max_count": p.max_count,
                "placements": list(p.placements),
            })
        models[model.name] = {
            "pci_device_id": model.pci_device_ids[0], "memory_mib": int(model.memory_gib * 1024),
            "mig_capable": model.mig_capable, "compute_capability": [9, 0] if "H" in model.slug[:2] else [8, 0],
            "profiles": profiles,
        }
    return {"source": "gpushare.catalog (gpushare/data/mig_profiles.yaml)", "models": models}


def fixture_packages() -> list[Package]:
    sim, bins, units, mig = SOURCES / "sim", SOURCES / "bin", SOURCES / "units", SOURCES / "mig-manager"
    pkgs: list[Package] = []
    pkgs.append(Package("python3-pynvml", "13.580.95-gpusim1", "debian",
                        "NVML Python bindings: load the driver's NVML, the simulator (gpushare test fixture)",
                        depends=["python3"])
                .add("/usr/lib/python3/dist-packages/pynvml.py", sim / "pynvml_bindings.py"))
    pkgs.append(Package("gpushare-testbed-node", "1.0", "debian",
                        "Stand-ins for the site's kubelet and dcgm-exporter (gpushare test fixture)",
                        postinst="systemctl enable kubelet.service dcgm-exporter.service\n")
                .add("/lib/systemd/system/kubelet.service", units / "kubelet.service")
                .add("/lib/systemd/system/dcgm-exporter.service", units / "dcgm-exporter.service"))
    branch = DRIVER_VERSION.split(".")[0]
    # The driver: its NVML (the simulator over the host's simulated GPUs, MIG tables from gpushare's catalog),
    # nvidia-smi and the `gpusim` command the tests drive the GPUs with.
    pkgs.append(Package(f"nvidia-driver-{branch}", f"{DRIVER_VERSION}-1", "cuda",
                        "NVIDIA driver stand-in: simulated NVML, nvidia-smi (gpushare test fixture)",
                        depends=["python3"])
                .add("/usr/lib/gpusim/pynvml.py", sim / "pynvml.py")
                .add("/usr/lib/gpusim/gpusim.py", sim / "gpusim.py")
                .add("/usr/share/gpusim/tables.json", json.dumps(simulator_tables(), indent=1, sort_keys=True))
                .add("/usr/share/gpusim/driver.json", json.dumps({"version": DRIVER_VERSION, "cuda": DRIVER_CUDA}))
                .add("/usr/bin/gpusim", bins / "gpusim", 0o755)
                .add("/usr/bin/nvidia-smi", bins / "nvidia-smi", 0o755))
    pkgs.append(Package(f"nvidia-fabricmanager-{branch}", f"{DRIVER_VERSION}-1", "cuda",
                        "NVIDIA fabric manager (gpushare test fixture)")
                .add("/usr/bin/nv-fabricmanager", bins / "nv-fabricmanager", 0o755)
                .add("/usr/share/gpusim/fabricmanager-version", DRIVER_VERSION + "\n")
                .add("/lib/systemd/system/nvidia-fabricmanager.service", units / "nvidia-fabricmanager.service"))
    for version in TOOLKIT_VERSIONS:
        full = f"{version}-1"
        pkgs.append(Package("libnvidia-container1", full, "nvidia-container-toolkit",
                            "NVIDIA container library (gpushare test fixture)")
                    .add("/usr/share/doc/libnvidia-container1/VERSION", version + "\n"))
        pkgs.append(Package("libnvidia-container-tools", full, "nvidia-container-toolkit",
                            "NVIDIA container library tools (gpushare test fixture)",
                            depends=[f"libnvidia-container1 (= {full})"])
                    .add("/usr/share/doc/libnvidia-container-tools/VERSION", version + "\n"))
        pkgs.append(Package("nvidia-container-toolkit-base", full, "nvidia-container-toolkit",
                            "NVIDIA Container Toolkit base: nvidia-ctk over the simulated GPUs (gpushare test fixture)",
                            depends=["python3-yaml"],
                            conffiles=["/etc/nvidia-container-runtime/config.toml"])
                    .add("/usr/bin/nvidia-ctk", bins / "nvidia-ctk", 0o755)
                    .add("/usr/bin/nvidia-container-runtime", bins / "nvidia-container-runtime", 0o755)
                    .add("/usr/share/gpusim/toolkit-version", version + "\n")
                    .add("/etc/nvidia-container-runtime/config.toml",
                         "# package default: accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers\n"
                         "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
                    .add("/lib/systemd/system/nvidia-cdi-refresh.service", units / "nvidia-cdi-refresh.service"))
        pkgs.append(Package("nvidia-container-toolkit", full, "nvidia-container-toolkit",
                            "NVIDIA Container Toolkit (gpushare test fixture)",
                            depends=[f"nvidia-container-toolkit-base (= {full})",
                                     f"libnvidia-container-tools (= {full})"])
                    .add("/usr/share/doc/nvidia-container-toolkit/VERSION", version + "\n"))
    manager = (Package("nvidia-mig-manager", MIG_MANAGER_VERSION, "mig-manager",
                       "mig-parted and its systemd service (gpushare test fixture)",
                       depends=["python3-yaml"],
                       conffiles=["/etc/systemd/system/nvidia-mig-manager.service.d/override.conf",
                                  "/etc/nvidia-mig-manager/hooks.sh", "/etc/nvidia-mig-manager/hooks.yaml"],
                       postinst="systemctl enable nvidia-mig-manager.service\n")
               .add("/usr/bin/nvidia-mig-parted", bins / "nvidia-mig-parted", 0o755)
               .add("/lib/systemd/system/nvidia-mig-manager.service", mig / "nvidia-mig-manager.service")
               .add("/etc/systemd/system/nvidia-mig-manager.service.d/override.conf", mig / "override.conf"))
    for name in ("service.sh", "utils.sh", "hooks.sh", "hooks.yaml"):
        manager.add(f"/etc/nvidia-mig-manager/{name}", mig / name, 0o755 if name.endswith(".sh") else 0o644)
    pkgs.append(manager)
    pkgs.append(Package("datacenter-gpu-manager-4-core", DCGM_VERSION, "cuda",
                        "DCGM 4 core: host engine and dcgmi over the simulated GPUs (gpushare test fixture)",
                        depends=["python3"])
                .add("/usr/bin/dcgmi", bins / "dcgmi", 0o755)
                .add("/usr/bin/nv-hostengine", bins / "nv-hostengine", 0o755)
                .add("/lib/systemd/system/nvidia-dcgm.service", units / "nvidia-dcgm.service"))
    for cuda in (12, 13):
        pkgs.append(Package(f"datacenter-gpu-manager-4-cuda{cuda}", DCGM_VERSION, "cuda",
                            f"DCGM 4 diagnostic plugins for CUDA {cuda} (gpushare test fixture)",
                            depends=[f"datacenter-gpu-manager-4-core (= {DCGM_VERSION})"])
                    .add(f"/{_DCGM_PLUGINS}/cuda{cuda}/README", f"diagnostic plugins for CUDA {cuda}\n"))
    return pkgs


def build_deb(pkg: Package, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pkg"
        for rel, (data, mode) in pkg.files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        control = root / "DEBIAN"
        control.mkdir(parents=True)
        lines = [f"Package: {pkg.name}", f"Version: {pkg.version}", "Architecture: all",
                 "Maintainer: gpushare tests <gpushare@localhost>", "Section: misc", "Priority: optional"]
        if pkg.depends:
            lines.append("Depends: " + ", ".join(pkg.depends))
        lines.append(f"Description: {pkg.description}")
        (control / "control").write_text("\n".join(lines) + "\n")
        if pkg.conffiles:
            (control / "conffiles").write_text("\n".join(pkg.conffiles) + "\n")
        if pkg.postinst:
            script = control / "postinst"
            script.write_text("#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n" + pkg.postinst + "fi\n")
            script.chmod(0o755)
        deb = out_dir / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                       stdout=subprocess.DEVNULL)
        return deb


def download_debian(cache: Path) -> list[Path]:
    """Debian's own packages for the test hosts, fetched once on this machine (the hosts have no route out)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = [next(iter(sorted(cache.glob(f"{name}_*.deb"))), None) for name in DEBIAN_DOWNLOADS]
    missing = [name for name, deb in zip(DEBIAN_DOWNLOADS, found, strict=True) if deb is None]
    if missing:
        cmd = ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *missing]
        if subprocess.run(cmd, cwd=cache, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(cmd, cwd=cache, check=True, capture_output=True)
    return sorted(p for name in DEBIAN_DOWNLOADS for p in cache.glob(f"{name}_*.deb"))


def recipe_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([*SOURCES.rglob("*"), Path(__file__)]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(HERE)).encode())
            digest.update(path.read_bytes())
    digest.update(json.dumps(simulator_tables(), sort_keys=True).encode())
    return digest.hexdigest()[:12]


def build_repository(build: Path) -> Path:
    """build/ansible/apt-<digest>/ with one flat repository per directory; reused while the recipe is unchanged."""
    repo = build / f"apt-{recipe_digest()}"
    if (repo / ".complete").exists():
        return repo
    tmp = build / f".{repo.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("debian", "nvidia-container-toolkit", "cuda", "mig-manager"):
        (tmp / sub).mkdir(parents=True)
    for pkg in fixture_packages():
        build_deb(pkg, tmp / pkg.repo)
    for deb in download_debian(build / "debian-downloads"):
        shutil.copy2(deb, tmp / "debian" / deb.name)
    for sub in tmp.iterdir():
        index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=sub, check=True,
                               capture_output=True, text=True).stdout
        (sub / "Packages").write_text(index)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(repo, ignore_errors=True)
    tmp.rename(repo)
    for old in build.glob("apt-*"):
        if old != repo:
            shutil.rmtree(old, ignore_errors=True)
    return repo
