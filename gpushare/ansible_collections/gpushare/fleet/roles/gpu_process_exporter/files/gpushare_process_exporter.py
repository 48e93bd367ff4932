#!/usr/bin/env python3
"""gpushare per-process GPU exporter: which pod container uses how much of a shared GPU (docs/monitoring.md).

Each scrape reads NVML once (per GPU: compute processes with their memory, MPS clients, per-process utilization
samples since the previous scrape), maps each GPU process to its pod and container through /proc/<pid>/cgroup and
the kubelet's log directories (/var/log/containers, /var/log/pods: world-readable names that carry namespace, pod,
container and container ID), and asks the kubelet's pod-resources API (v1 List) which GPU devices each container
holds. Nothing else in /proc is read. A source that fails (NVML, the pod-resources socket) reports
gpushare_process_exporter_up{source} 0 and the scrape still answers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOG = logging.getLogger("gpushare-process-exporter")
LABELS = ("Hostname", "UUID", "gpu", "GPU_I_ID", "namespace", "pod", "pod_uid", "container", "tenant", "share")
NOT_AVAILABLE = 0xFFFFFFFF
LIST_METHOD = "/v1.PodResourcesLister/List"

# /proc/<pid>/cgroup of a kubelet pod's container: systemd driver (kubepods-burstable-pod<uid_with_>.slice/
# cri-containerd-<id>.scope, crio-<id>.scope) and cgroupfs driver (/kubepods/burstable/pod<uid>/<id>).
_POD = re.compile(r"kubepods[^/]*?-pod([0-9a-f_]{36})\.slice|/kubepods(?:/[a-z]+)?/pod([0-9a-f-]{36})(?:/|$)")
_CONTAINER = re.compile(r"(?:cri-containerd|crio|docker)-([0-9a-f]{64})\.scope|/pod[0-9a-f-]{36}/([0-9a-f]{64})")
# /var/log/containers/<pod>_<namespace>_<container>-<container id>.log, /var/log/pods/<namespace>_<pod>_<uid>
_CONTAINER_LOG = re.compile(r"^(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<container>.+)-(?P<id>[0-9a-f]{64})\.log$")
_POD_LOG = re.compile(r"^(?P<ns>[^_]+)_(?P<pod>[^_]+)_(?P<uid>[0-9a-f-]{36})$")


def pod_of(cgroup_text: str) -> tuple[str, str]:
    """(pod UID, container ID) from a /proc/<pid>/cgroup text; ("", "") for a process outside any pod."""
    uid = cid = ""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        found = _POD.search(path)
        if found:
            uid = (found.group(1) or found.group(2)).replace("_", "-")
            container = _CONTAINER.search(path)
            if container:
                cid = container.group(1) or container.group(2)
                break
    return uid, cid


# ---------------------------------------------------------------- the kubelet's pod-resources API (v1)


def podresources_messages():
    """ListPodResourcesRequest/Response of k8s.io/kubelet/pkg/apis/podresources/v1, built from descriptors (only the
    fields read here; the others are skipped as unknown fields)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="gpushare/podresources_v1.proto", package="v1", syntax="proto3")
    string, message = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    one, many = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    shapes = {
        "ListPodResourcesRequest": [],
        "ListPodResourcesResponse": [("pod_resources", 1, message, many, ".v1.PodResources")],
        "PodResources": [("name", 1, string, one, ""), ("namespace", 2, string, one, ""),
                         ("containers", 3, message, many, ".v1.ContainerResources")],
        "ContainerResources": [("name", 1, string, one, ""), ("devices", 2, message, many, ".v1.ContainerDevices")],
        "ContainerDevices": [("resource_name", 1, string, one, ""), ("device_ids", 2, string, many, "")],
    }
    for name, fields in shapes.items():
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label, tname in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                field.type_name = tname
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.21
        make = message_factory.GetMessageClass
    else:  # pragma: no cover - protobuf 3.x (Debian bookworm's python3-protobuf)
        make = message_factory.MessageFactory(pool).GetPrototype
    return (make(pool.FindMessageTypeByName("v1.ListPodResourcesRequest")),
            make(pool.FindMessageTypeByName("v1.ListPodResourcesResponse")))


def list_pod_resources(path: str, timeout: float) -> list[dict]:
    """[{namespace, pod, container, devices: [(resource, device id)]}] from the kubelet; raises on any failure."""
    import grpc

    if not os.path.exists(path):
        raise FileNotFoundError(f"no pod-resources socket at {path}")
    request, response = podresources_messages()
    with grpc.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_unary(LIST_METHOD, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=response.FromString)
        answer = call(request(), timeout=timeout)
    return [{"namespace": p.namespace, "pod": p.name, "container": c.name,
             "devices": [(d.resource_name, i) for d in c.devices for i in d.device_ids]}
            for p in answer.pod_resources for c in p.containers]


# ---------------------------------------------------------------- the exporter


class Exporter:
    def __init__(self, nvml, node: str, socket_path: str, tenants_file: str = "", proc_root: str = "/proc",
                 log_root: str = "/var/log", timeout: float = 2.0, mps_resources: tuple[str, ...] = ()):
        self.nvml, self.node, self.socket_path, self.tenants_file = nvml, node, socket_path, tenants_file
        self.proc_root, self.log_root, self.timeout, self.mps_resources = proc_root, log_root, timeout, mps_resources
        self.lock, self.nvml_ready = threading.Lock(), False
        self.state: dict[str, bool] = {}  # source -> up, for one log line per change
        self.last_sample: dict[str, int] = {}  # GPU UUID -> newest utilization sample timestamp seen (µs)
        self.tenants: dict[str, str] = {}
        self.tenants_mtime: float | None = None

    def _report(self, source: str, ok: bool, why: str = "") -> None:
        """One log line per state change of a source."""
        if self.state.get(source) != ok:
            (LOG.info if ok else LOG.warning)("%s %s%s", source, "up" if ok else "down", f": {why}" if why else "")
        self.state[source] = ok

    def _tenant(self, namespace: str) -> str:
        try:
            mtime = os.stat(self.tenants_file).st_mtime if self.tenants_file else None
        except OSError:
            mtime = None
        if mtime != self.tenants_mtime:
            self.tenants_mtime, self.tenants = mtime, {}
            if mtime is not None:
                try:
                    with open(self.tenants_file) as handle:
                        self.tenants = {str(k): str(v) for k, v in json.load(handle).items()}
                except (OSError, ValueError, AttributeError) as exc:
                    LOG.warning("tenants file %s unreadable: %s", self.tenants_file, exc)
        return self.tenants.get(namespace, "") if namespace else ""

    def _nvml_init(self) -> bool:
        if not self.nvml_ready:
            try:
                if self.nvml is None:
                    raise ImportError("the pynvml module (nvidia-ml-py) is not installed")
                self.nvml.nvmlInit()
                self.nvml_ready = True
            except Exception as exc:  # NVMLError, or a library that does not load at all
                self._report("nvml", False, f"nvmlInit: {type(exc).__name__} {exc}")
        return self.nvml_ready

    def _call(self, fn, *args, default=None):
        """An NVML call that a driver or GPU may not support: default on NotSupported/NotFound and the like."""
        try:
            return getattr(self.nvml, fn)(*args)
        except self.nvml.NVMLError as exc:
            LOG.debug("%s: %s", fn, exc)
            return default
        except AttributeError:  # bindings too old for the call
            return default

    def read_gpus(self) -> list[dict]:
        """One NVML pass: per GPU its UUID, MIG devices, processes (pid, memory, GI), MPS pids, SM/mem samples."""
        gpus = []
        nv = self.nvml
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = nv.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            gpu: dict[str, Any] = {"index": index, "uuid": uuid, "mig": {}, "procs": [], "mps": set(), "util": None}
            for slot in range(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0):
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
                if mig is not None:
                    mig_uuid = self._call("nvmlDeviceGetUUID", mig, default="")
                    mig_uuid = mig_uuid.decode() if isinstance(mig_uuid, bytes) else mig_uuid
                    gpu["mig"][mig_uuid] = str(self._call("nvmlDeviceGetGpuInstanceId", mig, default=""))
            mps = self._call("nvmlDeviceGetMPSComputeRunningProcesses", handle, default=[]) or []
            gpu["mps"] = {int(p.pid) for p in mps}
            procs: dict[int, dict] = {}  # an MPS client may be in both lists
            for proc in [*(self._call("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) or []), *mps]:
                gi = getattr(proc, "gpuInstanceId", NOT_AVAILABLE)
                procs.setdefault(int(proc.pid), {"pid": int(proc.pid), "memory": int(proc.usedGpuMemory or 0),
                                                 "gi": "" if gi in (None, NOT_AVAILABLE) else str(gi)})
            gpu["procs"] = list(procs.values())
            gpu["util"] = self._samples(handle, uuid)
            gpus.append(gpu)
        return gpus

    def _samples(self, handle, uuid: str) -> dict | None:
        """pid -> (mean SM %, mean memory-controller %) over the samples since the last scrape; None if unsupported."""
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, self.last_sample.get(uuid, 0))
        except self.nvml.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_NotFound" or getattr(exc, "value", None) == 6:
                return {}  # no samples in the window: every process idle
            LOG.debug("nvmlDeviceGetProcessUtilization on %s: %s", uuid, exc)
            return None
        per_pid: dict[int, list] = {}
        for sample in samples:
            per_pid.setdefault(int(sample.pid), []).append((sample.smUtil, sample.memUtil))
            self.last_sample[uuid] = max(self.last_sample.get(uuid, 0), int(sample.timeStamp))
        return {pid: (sum(s for s, _ in v) / len(v), sum(m for _, m in v) / len(v)) for pid, v in per_pid.items()}

    def _names(self) -> tuple[dict, dict]:
        """container ID -> (namespace, pod, container) and pod UID -> (namespace, pod) from the kubelet's log names."""
        containers, pods = {}, {}
        for name in _listdir(os.path.join(self.log_root, "containers")):
            m = _CONTAINER_LOG.match(name)
            if m:
                containers[m["id"]] = (m["ns"], m["pod"], m["container"])
        for name in _listdir(os.path.join(self.log_root, "pods")):
            m = _POD_LOG.match(name)
            if m:
                pods[m["uid"]] = (m["ns"], m["pod"])
        return containers, pods

    def collect(self) -> tuple[list, dict]:
        """(samples, up): samples as (metric, labels dict, value)."""
        with self.lock:
            started = time.monotonic()
            gpus: list[dict] = []
            if self._nvml_init():
                try:
                    gpus = self.read_gpus()
                    self._report("nvml", True)
                except Exception as exc:
                    gpus = []
                    self.nvml_ready = False  # init again next scrape (driver reloaded, GPU lost)
                    self._report("nvml", False, f"{type(exc).__name__}: {exc}")
            try:
                allocations = list_pod_resources(self.socket_path, self.timeout)
                self._report("podresources", True)
            except Exception as exc:  # socket missing, refused, garbage, deadline
                allocations = None
                self._report("podresources", False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            samples = self._build(gpus, allocations or [])
            up = {"nvml": int(self.state.get("nvml", False)), "podresources": int(allocations is not None)}
            samples.append(("gpushare_process_exporter_scrape_duration_seconds", {}, time.monotonic() - started))
            return samples, up

    def _build(self, gpus: list[dict], allocations: list[dict]) -> list:
        by_uuid = {g["uuid"]: g for g in gpus}
        mig_owner = {mig: (g["uuid"], gi) for g in gpus for mig, gi in g["mig"].items()}
        groups: dict[tuple[str, str, str, str, str, str], dict[str, Any]] = {}  # (uuid, gi, ns, pod, uid, container)
        held: dict[tuple, list] = {}  # (namespace, pod, container) -> [(uuid, gi, share kind)]

        def group(uuid, gi, ns, pod, uid, container):
            return groups.setdefault((uuid, gi, ns, pod, uid, container),
                                     {"sm": 0.0, "mem": 0, "shares": 0, "share": "", "util": False})

        for alloc in allocations:
            per_gpu: dict[tuple, int] = {}
            kinds: dict[tuple, str] = {}
            for resource, device in alloc["devices"]:
                base, replica = device.split("::", 1)[0], "::" in device
                if base in mig_owner:
                    key, kind = mig_owner[base], "mig"
                elif base in by_uuid:
                    key = (base, "")
                    kind = ("mps" if resource in self.mps_resources else "time-slicing") if replica else "exclusive"
                else:
                    continue  # not a GPU of this host (another device plugin's resource)
                per_gpu[key] = per_gpu.get(key, 0) + (1 if kind in ("mig", "exclusive") or replica else 0)
                kinds[key] = kind
            for (uuid, gi), count in per_gpu.items():
                ident = (alloc["namespace"], alloc["pod"], alloc["container"])
                held.setdefault(ident, []).append((uuid, gi, kinds[(uuid, gi)]))
                g = group(uuid, gi, alloc["namespace"], alloc["pod"], "", alloc["container"])
                g["shares"], g["share"] = max(g["shares"], 1 if kinds[(uuid, gi)] in ("mig", "exclusive") else count), \
                    kinds[(uuid, gi)]
        containers, pods = self._names() if any(g["procs"] for g in gpus) else ({}, {})
        pod_uids: dict[tuple, str] = {}
        for gpu in gpus:
            util = gpu["util"]
            for proc in gpu["procs"]:
                uid, cid = pod_of(_read(os.path.join(self.proc_root, str(proc["pid"]), "cgroup")))
                ns, pod, container = containers.get(cid) or (pods.get(uid, ("", "")) + ("",))
                if uid and not container:  # the pod's one container that holds this GPU
                    names = [c for (n, p, c), gs in held.items() if (n, p) == (ns, pod) and
                             any(u == gpu["uuid"] for u, _, _ in gs)]
                    container = names[0] if len(names) == 1 else ""
                gi = proc["gi"]
                if uid and (ns, pod, container) in held:
                    gi = next((g for u, g, _ in held[(ns, pod, container)] if u == gpu["uuid"]), gi)
                    pod_uids[(ns, pod, container)] = uid
                g = group(gpu["uuid"], gi, ns, pod, "" if (ns, pod, container) in held else uid, container)
                g["mem"] += proc["memory"]
                if proc["pid"] in gpu["mps"] and g["share"] in ("", "time-slicing"):
                    g["share"] = "mps"
                if util is not None:
                    g["util"] = True
                    g["sm"] += util.get(proc["pid"], (0, 0))[0] / 100.0
        for (_, _, ns, pod, uid, container), g in groups.items():  # allocated containers: the cgroups' pod UID
            if not uid and (ns, pod, container) in pod_uids:
                g["uid"] = pod_uids[(ns, pod, container)]
        share_of_gpu: dict[tuple[str, str], str] = {}
        for (uuid, gi, *_), g in groups.items():
            if g["share"] and share_of_gpu.get((uuid, gi)) != "mps":
                share_of_gpu[(uuid, gi)] = g["share"]
        out = []
        for (uuid, gi, ns, pod, uid, container), g in sorted(groups.items()):
            found = by_uuid.get(uuid)
            share = g["share"] or share_of_gpu.get((uuid, gi)) or ("mig" if gi else "exclusive")
            labels = {"Hostname": self.node, "UUID": uuid, "gpu": str(found["index"]) if found else "", "GPU_I_ID": gi,
                      "namespace": ns, "pod": pod, "pod_uid": g.get("uid", uid), "container": container,
                      "tenant": self._tenant(ns), "share": share}
            if found is not None and found["util"] is not None:
                out.append(("gpushare_pod_gpu_sm_utilization_ratio", labels, min(g["sm"], 1.0)))
            out.append(("gpushare_pod_gpu_memory_used_bytes", labels, g["mem"]))
            out.append(("gpushare_pod_gpu_allocated_shares", labels, g["shares"]))
        return out


def _listdir(path: str) -> list[str]:
    return os.listdir(path) if os.path.isdir(path) else []


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the process ended after NVML listed it, or is not visible to this user
        return ""


HELP = {
    "gpushare_pod_gpu_sm_utilization_ratio": "Pod container's share of the GPU's SM time over the last sample window",
    "gpushare_pod_gpu_memory_used_bytes": "GPU memory used by the pod container's processes",
    "gpushare_pod_gpu_allocated_shares": "Shares of this GPU the pod container holds (replicas; 1 for MIG/whole)",
    "gpushare_process_exporter_up": "Whether the source answered this scrape (nvml, podresources)",
    "gpushare_process_exporter_scrape_duration_seconds": "Time this scrape took",
}


def _escape(value: str) -> str:
    return str(value).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(samples: list, up: dict) -> str:
    """Prometheus text exposition format 0.0.4."""
    families: dict[str, list] = {name: [] for name in HELP}
    for name, labels, value in samples:
        families[name].append((labels, value))
    families["gpushare_process_exporter_up"] = [({"source": s}, v) for s, v in sorted(up.items())]
    lines = []
    for name, rows in families.items():
        lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge"]
        for labels, value in rows:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {float(value)!r}" if text else f"{name} {float(value)!r}")
    return "\n".join(lines) + "\n"


def serve(exporter: Exporter, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = render(*exporter.collect()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="0.0.0.0:9835", help="address:port to serve /metrics on")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname())
    parser.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock")
    parser.add_argument("--tenants-file", default="", help="JSON object namespace -> gpushare tenant")
    parser.add_argument("--log-root", default="/var/log", help="where the kubelet's containers/ and pods/ are")
    parser.add_argument("--timeout", type=float, default=2.0, help="pod-resources call deadline, seconds")
    parser.add_argument("--mps-resource", action="append", default=[], help="resource names served through MPS")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        import pynvml as nvml
    except ImportError:  # reported as nvml down by every scrape's nvmlInit
        nvml = None
    host, _, port = args.listen.rpartition(":")
    exporter = Exporter(nvml, args.node_name, args.pod_resources_socket, args.tenants_file,
                        log_root=args.log_root, timeout=args.timeout, mps_resources=tuple(args.mps_resource))
    server = serve(exporter, host.strip("[]") or "0.0.0.0", int(port))
    LOG.info("serving on %s for node %s", args.listen, args.node_name)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
