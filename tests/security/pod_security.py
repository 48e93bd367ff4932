"""The Pod Security Standards' checks that matter for GPU tenants, after the upstream definitions
(https://kubernetes.io/docs/concepts/security/pod-security-standards/): baseline (host namespaces, privileged,
capabilities beyond the default set, hostPath, host ports, /proc mount, seccomp Unconfined) and restricted on top
(privilege escalation, non-root, seccomp profile set, drop ALL, volume types). A small evaluator to show what
each tenant namespace's level refuses; the API server's own Pod Security admission is the real one."""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
LEVELS = ("privileged", "baseline", "restricted")


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a pod or a controller's template (Pod Security checks templates too, as warnings)."""
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("containers", []), *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]


def _baseline(spec: dict[str, Any]) -> list[str]:
    out = [f"host namespaces ({f})" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    pod_sc = spec.get("securityContext", {})
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        out.append("seccompProfile Unconfined (pod)")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v['name']}")
    for c in _containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"privileged ({c['name']})")
        added = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        if added:
            out.append(f"capabilities {sorted(added)} ({c['name']})")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"procMount {sc['procMount']} ({c['name']})")
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            out.append(f"seccompProfile Unconfined ({c['name']})")
        if any(p.get("hostPort", 0) for p in c.get("ports", [])):
            out.append(f"hostPort ({c['name']})")
    return out


def _restricted(spec: dict[str, Any]) -> list[str]:
    out = []
    pod_sc = spec.get("securityContext", {})
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume type {sorted(kinds)} ({v['name']})")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_sc.get("runAsUser") == 0:
        out.append("runAsUser 0 (pod)")
    for c in _containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"allowPrivilegeEscalation not false ({c['name']})")
        if sc.get("runAsNonRoot") is False or (not pod_non_root and sc.get("runAsNonRoot") is not True):
            out.append(f"runAsNonRoot not true ({c['name']})")
        if sc.get("runAsUser") == 0:
            out.append(f"runAsUser 0 ({c['name']})")
        container_seccomp = sc.get("seccompProfile", {}).get("type")
        if not (container_seccomp in ("RuntimeDefault", "Localhost") or (pod_seccomp and container_seccomp is None)):
            out.append(f"seccompProfile not RuntimeDefault or Localhost ({c['name']})")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"capabilities not dropping ALL ({c['name']})")
        added = set(caps.get("add", [])) - RESTRICTED_CAPABILITIES
        if added:
            out.append(f"capabilities {sorted(added)} added ({c['name']})")
    return out


def violations(obj: dict[str, Any], level: str) -> list[str]:
    """What the level refuses in the object's pod spec: empty when it is admitted."""
    assert level in LEVELS, level
    spec = pod_spec(obj)
    if level == "privileged":
        return []
    out = _baseline(spec)
    if level == "restricted":
        out += _restricted(spec)
    return out
