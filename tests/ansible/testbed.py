"""Isolated test hosts for gpushare's Ansible roles (docs/testing.md): a debootstrap'd Debian bookworm rootfs
(built once, cached under build/ansible/), copied per host and booted with its own systemd by systemd-nspawn in
its own network namespace on a 10.x veth pair, reached over ssh with a generated key. Packages come from the
local apt repository (packages.py) bind-mounted read-only into each host; GPUs from the NVML simulator.

Everything started here is ended here, by PID, even when a test fails: nspawn processes (SIGTERM halts the
container cleanly, SIGKILL after a timeout), veth pairs, network namespaces, rootfs copies. A host that reboots
(nspawn exits 133) is booted again by its supervisor thread, as systemd-nspawn@.service would.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.ansible import packages

ROOT = packages.ROOT
BUILD = ROOT / "build" / "ansible"
MIRROR = os.environ.get("GPUSHARE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
INCLUDE = "python3,python3-apt,systemd,systemd-sysv,dbus,openssh-server,sudo,libseccomp2,iproute2"
REPO_MOUNT = "/srv/gpushare-apt"
# Units that would only slow boots down or take apt's lock in the middle of a test.
MASKED = ("apt-daily.timer", "apt-daily-upgrade.timer", "apt-daily.service", "apt-daily-upgrade.service",
          "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "systemd-timesyncd.service",
          "getty@tty1.service", "dpkg-db-backup.timer",
          "systemd-tmpfiles-setup-dev.service")  # a container may not create device nodes; nspawn provides /dev
NS_PATTERN = re.compile(r"^gsnt(\d+)x(\d+)$")

# The site's containerd config before gpushare: systemd cgroups for runc and a registry setting, both of which a
# careless containerd 1.x drop-in would silently drop.
SITE_CONTAINERD_CONFIG = """\
# Site containerd config (gpushare test host): what the Kubernetes node bootstrap wrote.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"""


class TestbedError(RuntimeError):
    __test__ = False


def run(cmd: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip() or result.stdout}")
    return result


# ---------------------------------------------------------------- the cached rootfs


@contextlib.contextmanager
def build_lock():
    """One builder at a time: another test run (another developer's `make test`) may share build/ansible/."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def rootfs_digest() -> str:
    return hashlib.sha256("|".join([MIRROR, INCLUDE, *MASKED, "v2"]).encode()).hexdigest()[:10]


def build_rootfs() -> Path:
    """build/ansible/rootfs-<digest>: debootstrap once (about a minute), then reused."""
    base = BUILD / f"rootfs-{rootfs_digest()}"
    if (base / ".complete").exists():
        return base
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = BUILD / f".{base.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    log = BUILD / "debootstrap.log"
    for attempt in range(3):  # the mirror sometimes drops a download; debootstrap does not retry by itself
        shutil.rmtree(tmp, ignore_errors=True)
        with open(log, "w") as out:
            result = subprocess.run(["debootstrap", "--variant=minbase", f"--include={INCLUDE}", "bookworm",
                                     str(tmp), MIRROR], stdout=out, stderr=subprocess.STDOUT)
        if result.returncode == 0:
            break
        time.sleep(5 * (attempt + 1))
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TestbedError(f"debootstrap failed three times; see {log}")
    # The hosts reach only the local repository (the site's mirror); never Debian's.
    (tmp / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{REPO_MOUNT}/debian ./\n")
    (tmp / "etc/apt/apt.conf.d/90gpushare-test").write_text(
        'Acquire::Languages "none";\nAPT::Install-Recommends "false";\n')
    (tmp / "etc/dpkg/dpkg.cfg.d/90gpushare-test").write_text(
        "path-exclude=/usr/share/doc/*\npath-exclude=/usr/share/man/*\npath-exclude=/usr/share/locale/*\n")
    (tmp / "etc/ssh/sshd_config.d/gpushare-test.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\nMaxStartups 100:30:200\n"
        "MaxSessions 100\n")
    for unit in MASKED:
        link = tmp / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (tmp / "etc/machine-id").write_text("")
    (tmp / ".complete").write_text("ok\n")
    tmp.rename(base)
    for old in BUILD.glob("rootfs-*"):
        if old != base:
            shutil.rmtree(old, ignore_errors=True)
    return base


# ---------------------------------------------------------------- ssh


def ssh_key() -> Path:
    key = BUILD / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpushare-testbed", "-f", str(key)])
    return key


SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]


# ---------------------------------------------------------------- one host


@dataclass
class HostSpec:
    name: str
    gpu_model: str | None
    gpu_count: int
    nvswitch: bool = False
    reset: bool = True  # whether a GPU reset is possible (False: MIG mode changes need a reboot)
    driver: bool = True  # whether the NVIDIA driver (fixture) is installed


@dataclass
class Host:
    spec: HostSpec
    index: int
    address: str
    gateway: str
    netns: str
    veth_host: str
    veth_guest: str
    root: Path
    log: Path
    key: Path
    repo: Path
    proc: subprocess.Popen | None = None
    boots: int = 0
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.spec.name

    # -- network

    def create_network(self) -> None:
        run(["ip", "netns", "add", self.netns])
        run(["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_guest])
        run(["ip", "link", "set", self.veth_guest, "netns", self.netns])
        run(["ip", "addr", "add", f"{self.gateway}/30", "dev", self.veth_host])
        run(["ip", "link", "set", self.veth_host, "up"])
        run(["ip", "-n", self.netns, "addr", "add", f"{self.address}/30", "dev", self.veth_guest])
        run(["ip", "-n", self.netns, "link", "set", self.veth_guest, "up"])
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])

    def delete_network(self) -> None:
        run(["ip", "link", "del", self.veth_host], check=False)
        run(["ip", "netns", "del", self.netns], check=False)

    # -- rootfs

    def prepare_root(self, base: Path) -> None:
        run(["cp", "-a", "--reflink=auto", str(base), str(self.root)])
        (self.root / "etc/hostname").write_text(self.name + "\n")
        (self.root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{self.address} {self.name}\n")
        ssh_dir = self.root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        (ssh_dir / "authorized_keys").chmod(0o600)
        hw = self.root / "etc/gpusim"
        hw.mkdir(parents=True, exist_ok=True)
        (hw / "hardware.json").write_text(json.dumps({"host": self.name, "model": self.spec.gpu_model,
                                                      "count": self.spec.gpu_count, "reset": self.spec.reset}))

    # -- boot

    def _nspawn(self) -> list[str]:
        return ["systemd-nspawn", "-q", "-D", str(self.root), f"--machine={self.name}", "--boot", "--register=no",
                "--keep-unit", f"--network-namespace-path=/run/netns/{self.netns}", "--console=read-only",
                f"--bind-ro={self.repo}:{REPO_MOUNT}"]

    def _supervise(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                with open(self.log, "a") as out:
                    self.proc = subprocess.Popen(self._nspawn(), stdin=subprocess.DEVNULL, stdout=out,
                                                 stderr=subprocess.STDOUT, start_new_session=True)
                self.boots += 1
            rc = self.proc.wait()
            if rc != 133:  # 133: the container asked for a reboot
                return

    def boot(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name=f"nspawn-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60) -> None:
        with self._lock:
            self._stopping = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- access

    def ssh(self, command: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return run(["ssh", "-i", str(self.key), *SSH_OPTIONS, f"root@{self.address}", command], check=check,
                   timeout=timeout)

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()

    def wait_ready(self, timeout: float = 120, previous_boot: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() not in (None, 133):
                raise TestbedError(f"{self.name}: systemd-nspawn exited {self.proc.returncode}; see {self.log}")
            try:
                with socket.create_connection((self.address, 22), timeout=2):
                    pass
                state = self.ssh("systemctl is-system-running --wait", check=False, timeout=60)
                if state.stdout.strip() in ("running", "degraded") and (
                        previous_boot is None or self.boot_id() != previous_boot):
                    if state.stdout.strip() == "degraded":
                        self._restart_cgroup_failures()
                    return
            except (OSError, subprocess.TimeoutExpired):
                pass
            time.sleep(1)
        raise TestbedError(f"{self.name} did not come up at {self.address} within {timeout:.0f}s; see {self.log}")

    def _restart_cgroup_failures(self) -> None:
        """Units that failed only because systemd could not set up their cgroup (exit status 219/CGROUP, seen when
        several containers boot at once on 2 loaded cores) are started once more; any other failure stays."""
        failed = self.ssh("systemctl --failed --no-legend --plain | awk '{print $1}'", check=False).stdout.split()
        for unit in failed:
            status = self.ssh(f"systemctl show -p ExecMainStatus --value {unit}", check=False).stdout.strip()
            if status == "219":
                self.ssh(f"systemctl reset-failed {unit} && systemctl start {unit}", check=False)

    def reboot(self, timeout: float = 120) -> None:
        before = self.boot_id()
        self.ssh("systemctl reboot", check=False)
        self.wait_ready(timeout=timeout, previous_boot=before)

    def install_site_software(self) -> None:
        """What a site's node bootstrap put there before gpushare: containerd with its own config, kubelet and a
        host dcgm-exporter (stand-ins), the NVIDIA driver, and on NVSwitch systems the fabric manager."""
        cuda = f"{REPO_MOUNT}/cuda"
        debs = []
        if self.spec.driver:
            debs.append(f"{cuda}/nvidia-driver-580_*.deb")
        if self.spec.nvswitch:
            debs.append(f"{cuda}/nvidia-fabricmanager-580_*.deb")
        config = SITE_CONTAINERD_CONFIG.replace("'", "'\\''")
        script = " && ".join([
            "apt-get update -qq",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Options::=--force-confold "
            f"containerd gpushare-testbed-node {' '.join(debs)} >/dev/null",
            f"printf '%s' '{config}' > /etc/containerd/config.toml",
            "cp /etc/containerd/config.toml /root/site-containerd-config.toml",
            "systemctl restart containerd",
            "systemctl start kubelet dcgm-exporter",
            *(["systemctl enable --now nvidia-fabricmanager"] if self.spec.nvswitch else []),
        ])
        self.ssh(script, timeout=600)


# ---------------------------------------------------------------- a set of hosts


class Testbed:
    """N hosts at <prefix>.<i>.2 (gateway <prefix>.<i>.1), i = 1..N; the prefix is the first 10.x from 10.77 on that
    no other test run on this machine holds, so concurrent runs (another developer's `make test`) never collide."""

    __test__ = False
    _instances = itertools.count()  # testbeds started in this process: each gets its own interface names

    def __init__(self, specs: list[HostSpec], tag: str = ""):
        self.specs = specs
        self.prefix = ""
        self.prefix_lock: Path | None = None
        self.run_dir = BUILD / "hosts" / f"{tag or 'run'}-{os.getpid()}"
        self.hosts: list[Host] = []
        self.repo: Path | None = None

    def address(self, index: int) -> str:
        return f"{self.prefix}.{index}.2"

    def __enter__(self) -> Testbed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise TestbedError("the test hosts need root (network namespaces, systemd-nspawn)")
        with build_lock():
            remove_stale_namespaces()
            base = build_rootfs()
            self.repo = packages.build_repository(BUILD)
            key = ssh_key()
            self.prefix, self.prefix_lock = allocate_prefix()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        # Several testbeds may live in one process (the session's and a module's own): each gets its own names.
        n = next(Testbed._instances) % 10
        for i, spec in enumerate(self.specs, start=1):
            address = self.address(i)
            if _address_in_use(address):
                raise TestbedError(f"{address} is already in use on this machine (another test run?)")
            host = Host(spec=spec, index=i, address=address, gateway=f"{self.prefix}.{i}.1",
                        netns=f"gsnt{pid}x{n * 100 + i}", veth_host=f"gsv{pid % 10**6}{n}h{i}",
                        veth_guest=f"gsv{pid % 10**6}{n}g{i}",
                        root=self.run_dir / spec.name, log=self.run_dir / f"{spec.name}.log", key=key, repo=self.repo)
            self.hosts.append(host)
            host.create_network()
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda h: h.prepare_root(base), self.hosts))
        for host in self.hosts:
            host.boot()
        # All boot at once on the same cores: the first may take as long as all of them on a busy machine.
        for host in self.hosts:
            host.wait_ready(timeout=120 + 30 * len(self.hosts))
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            list(pool.map(lambda h: h.install_site_software(), self.hosts))

    def close(self) -> None:
        errors = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(self.hosts), 1)) as pool:
            for result in pool.map(_stop_quietly, self.hosts):
                if result:
                    errors.append(result)
        for host in self.hosts:
            host.delete_network()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.prefix_lock is not None:
            self.prefix_lock.unlink(missing_ok=True)
        if errors:
            raise TestbedError("; ".join(errors))

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)


def _stop_quietly(host: Host) -> str:
    try:
        host.stop()
    except Exception as exc:  # noqa: BLE001 - report and go on cleaning the others
        return f"{host.name}: {exc}"
    return ""


LOCKS = Path("/run/lock/gpushare-testbed")


def allocate_prefix(first: int = 77, last: int = 126) -> tuple[str, Path]:
    """A 10.<n> prefix no other test run on this machine uses, held by a lock file naming this process."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    for second in range(first, last + 1):
        prefix = f"10.{second}"
        lock = LOCKS / prefix
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and Path(f"/proc/{owner}").exists():
                continue
            lock.unlink(missing_ok=True)  # left by a run that is gone
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        if _address_in_use(f"{prefix}.1.1") or _address_in_use(f"{prefix}.1.2"):
            lock.unlink(missing_ok=True)
            continue
        return prefix, lock
    raise TestbedError(f"no free 10.x prefix for test hosts ({first}-{last} are taken)")


def _address_in_use(address: str) -> bool:
    return address in run(["ip", "-o", "addr"], check=False).stdout.replace("/", " ").split()


def remove_stale_namespaces() -> None:
    """Namespaces left by an earlier run whose process is gone (and which hold no process any more)."""
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = NS_PATTERN.match(name)
        if not match or Path(f"/proc/{match.group(1)}").exists():
            continue
        if run(["ip", "netns", "pids", name], check=False).stdout.strip():
            continue  # something still runs in it: not ours to end
        run(["ip", "netns", "del", name], check=False)
