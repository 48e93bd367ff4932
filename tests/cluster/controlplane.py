"""A Kubernetes control plane on 127.0.0.1 for the suite: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (nodes and pods without kubelets or containers), all built from their Go modules.

Everything lives in one temporary folder: a CA, serving and client certificates, the service-account key pair,
kubeconfigs and each program's log. Ports are free ones picked at start, every address is loopback, and `stop()`
ends exactly the processes `start()` started, by PID (also when a test failed). Several clusters can share one
etcd, each under its own key prefix, so that every environment gets an API server of its own in seconds.

Admission is a default cluster's (the API server's default plugins: Pod Security, ValidatingAdmissionPolicy,
ResourceQuota, LimitRanger, ServiceAccount, ...) plus NodeRestriction, RBAC authorization, and the DRA feature
gates gpushare's DRA support uses.

By hand: `make cluster-up` (python -m tests.cluster.controlplane) starts one and prints its kubeconfig."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tests.cluster.bins import Binaries

# Gates of the DRA features gpushare renders for (time-slicing through consumable capacity, dynamic MIG through
# partitionable devices): beta and on by default from 1.36 (gpushare.core.kubeversions), so 1.36 and 1.37 run as
# they ship; before 1.36 they are alpha and switched on as a DRA cluster's operators would (and state in the
# environment's dra.kubernetes_feature_gates). Everything else (device taints, the extended-resource mapping, admin
# access) runs at the minor's defaults: the tests that need them say which minor they need.
OPERATOR_GATES = ("DRAConsumableCapacity", "DRAPartitionableDevices")


def feature_gates(kubernetes_version: str) -> str:
    from gpushare.core.kubeversions import gate_on_by_default

    return ",".join(f"{g}=true" for g in OPERATOR_GATES if not gate_on_by_default(g, kubernetes_version))


# kwok's stages (0.8 compiles none in): its own node stages, and its own pod stages unless a cluster brings others.
KWOK_NODE_STAGES = Path(__file__).with_name("kwok-stages-nodes.yaml")
KWOK_POD_STAGES = Path(__file__).with_name("kwok-stages-pods.yaml")
SERVICE_CIDR = "10.96.0.0/24"  # a setting only: nothing routes to it
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- certificates


@dataclass
class Pki:
    folder: Path
    ca_key: ec.EllipticCurvePrivateKey = field(init=False)
    ca_cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpushare-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                        .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                        .not_valid_before(now - datetime.timedelta(minutes=5))
                        .not_valid_after(now + datetime.timedelta(days=1))
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                     content_commitment=False, key_encipherment=False,
                                                     data_encipherment=False, key_agreement=False,
                                                     encipher_only=False, decipher_only=False), critical=True)
                        .sign(self.ca_key, hashes.SHA256()))
        self.write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        # The service-account token signing pair (RSA: the API server's issuer takes RSA or ECDSA; RSA is the usual).
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.write("sa.key", sa.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        self.write("sa.pub", sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))

    def write(self, name: str, data: bytes) -> Path:
        path = self.folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def issue(self, name: str, common_name: str, organizations: tuple[str, ...] = (), server: bool = False) -> None:
        """`name.crt` and `name.key`, signed by the CA: a client certificate (CN = user, O = groups) or the API
        server's serving certificate for the loopback address and the in-cluster names."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                             *[x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]])
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        usage = x509.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
                x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"), x509.DNSName("kubernetes.default.svc.cluster.local")]),
                critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        self.write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        self.write(f"{name}.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))


# ---------------------------------------------------------------- processes


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _stream: IO[bytes]

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the PID we started, SIGKILL after 15 s; never anything else."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._stream.close()


def spawn(name: str, argv: list[str], folder: Path) -> Process:
    log = folder / f"{name}.log"
    stream = log.open("wb")
    popen = subprocess.Popen(argv, stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=folder, start_new_session=True)  # a new session: ^C in pytest reaches us, not them
    return Process(name, popen, log, stream)


def wait_until(what: str, ready: callable, processes: list[Process], timeout: float = START_TIMEOUT) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in processes:
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode} while waiting for {what}:\n{p.tail()}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not up yet: connection refused, TLS not ready, 5xx
            pass
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                       + "\n".join(f"--- {p.name}\n{p.tail()}" for p in processes))


class Etcd:
    """One etcd on 127.0.0.1 for every cluster of a test session (each under its own key prefix)."""

    def __init__(self, bins: Binaries, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        self.process = spawn("etcd", [
            bins["etcd"], "--name", "test", "--data-dir", str(folder / "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # test data: losing it on a crash is fine, waiting for the disk is not
            "--log-level", "warn"], folder)
        wait_until("etcd", lambda: urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200,
                   [self.process])

    def stop(self) -> None:
        self.process.stop()


class Cluster:
    """An API server (on its own etcd prefix), controller manager, scheduler and kwok."""

    def __init__(self, name: str, bins: Binaries, etcd: Etcd, folder: Path, kwok_config: Path | None = None) -> None:
        self.name = name
        self.folder = folder
        self.kwok_config = kwok_config  # kwok's pod stages; None: kwok's own (KWOK_POD_STAGES)
        self.processes: list[Process] = []
        folder.mkdir(parents=True, exist_ok=True)
        pki = Pki(folder / "pki")
        pki.issue("apiserver", "kube-apiserver", server=True)
        pki.issue("admin", "gpushare-test-admin", ("system:masters",))
        pki.issue("controller-manager", "system:kube-controller-manager")
        pki.issue("scheduler", "system:kube-scheduler")
        pki.issue("kwok", "kwok-controller", ("system:masters",))
        self.pki = pki
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self._kubeconfig("admin")
        try:
            self._start(bins, etcd)
        except BaseException:
            self.stop()
            raise

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig whose client certificate, signed by the cluster's CA, names `user` (CN) in `groups` (O): the
        identity an OIDC or certificate authenticator gives a person of the tenant, with no role but what RBAC binds
        to that user or those groups."""
        name = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        self.pki.issue(name, user, groups)
        return self._kubeconfig(name)

    def _kubeconfig(self, user: str) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": self.name,
            "clusters": [{"name": self.name, "cluster": {"server": self.server,
                                                         "certificate-authority": self.pki.path("ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": self.pki.path(f"{user}.crt"),
                                              "client-key": self.pki.path(f"{user}.key")}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
        }
        path = self.folder / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=self.pki.path("ca.crt"))
        ctx.load_cert_chain(self.pki.path("admin.crt"), self.pki.path("admin.key"))
        with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=3) as answer:
            return bool(answer.status == 200)

    def _start(self, bins: Binaries, etcd: Etcd) -> None:
        pki = self.pki
        on = feature_gates(bins.kubernetes_version)
        gates = [f"--feature-gates={on}"] if on else []
        apiserver = spawn("kube-apiserver", [
            bins["kube-apiserver"], f"--etcd-servers={etcd.url}", f"--etcd-prefix=/clusters/{self.name}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            # From 1.37 the endpoint reconciler refuses a loopback address for the `kubernetes` Service's endpoints;
            # nothing here routes to that Service, so no reconciler keeps them.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki.path('apiserver.crt')}", f"--tls-private-key-file={pki.path('apiserver.key')}",
            f"--client-ca-file={pki.path('ca.crt')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.path('sa.pub')}",
            f"--service-account-signing-key-file={pki.path('sa.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",  # as kubeadm sets it: gpushare's policies, not this flag, refuse privileged pods
            *gates, "--profiling=false", "--v=1"], self.folder)
        self.processes.append(apiserver)
        wait_until(f"kube-apiserver of {self.name}", self._ready, [apiserver])
        cm = self._kubeconfig("controller-manager")
        self.processes.append(spawn("kube-controller-manager", [
            bins["kube-controller-manager"], f"--kubeconfig={cm}", f"--authentication-kubeconfig={cm}",
            f"--authorization-kubeconfig={cm}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.path('sa.key')}", f"--root-ca-file={pki.path('ca.crt')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", *gates, "--v=1"],
            self.folder))
        scheduler = self._kubeconfig("scheduler")
        self.processes.append(spawn("kube-scheduler", [
            bins["kube-scheduler"], f"--kubeconfig={scheduler}", f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", *gates, "--v=1"], self.folder))
        kwok = self._kubeconfig("kwok")
        self.processes.append(spawn("kwok", [
            bins["kwok"], f"--kubeconfig={kwok}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
            "--cidr=10.0.0.1/24", "--node-ip=10.0.0.1", f"--server-address=127.0.0.1:{free_port()}",
            "--node-lease-duration-seconds=40",
            f"--config={KWOK_NODE_STAGES}", f"--config={self.kwok_config or KWOK_POD_STAGES}"], self.folder))
        # The controllers are up once the service-account controller has made the default namespace's account.
        wait_until(f"the controllers of {self.name}", self._default_service_account, self.processes)

    def _default_service_account(self) -> bool:
        ctx = ssl.create_default_context(cafile=self.pki.path("ca.crt"))
        ctx.load_cert_chain(self.pki.path("admin.crt"), self.pki.path("admin.key"))
        url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        with urllib.request.urlopen(url, context=ctx, timeout=3) as answer:
            return bool(answer.status == 200)

    def alive(self) -> list[str]:
        """Programs that have exited (a test that sees one names it)."""
        return [f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}" for p in self.processes
                if p.popen.poll() is not None]

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()


def main(argv: list[str] | None = None) -> int:
    from tests.cluster.bins import find

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="folder for certificates, kubeconfig and logs (default: temporary)")
    args = parser.parse_args(argv)
    bins, why = find()
    if bins is None:
        print(why, file=sys.stderr)
        return 1
    folder = args.dir.resolve() if args.dir else Path(tempfile.mkdtemp(prefix="gpushare-cluster-"))
    etcd = Etcd(bins, folder / "etcd")
    try:
        cluster = Cluster("gpushare-test", bins, etcd, folder / "cluster")
    except BaseException:
        etcd.stop()
        raise
    print(f"control plane up: {cluster.server}\n  export KUBECONFIG={cluster.kubeconfig}\n"
          f"logs in {cluster.folder}; ^C stops every process started here", flush=True)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopping and not cluster.alive():
            time.sleep(0.5)
        for line in cluster.alive():
            print(line, file=sys.stderr)
    finally:
        cluster.stop()
        etcd.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
