"""Workload policies on queues: GPU work through Kueue, its gate and suspension lifted by Kueue alone."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import KUEUE_GATE, QUEUE_LABEL
from gpushare.core.tenancy import LOCAL_QUEUE
from gpushare.policy.admission.cel import IS_UPDATE, _label, _labels, _lit, _strings, _template_labels
from gpushare.policy.admission.cluster import (
    IMPLICIT_EXTENDED_PREFIX,
    JOB_CONTROLLER_USERS,
    JOBSET_API_GROUP,
    jobset_user,
)


def _gpu_resource(key: str) -> str:
    return f"({key}.startsWith('nvidia.com/') || {key}.startsWith('{IMPLICIT_EXTENDED_PREFIX}'))"


def _asks_for_gpus(containers: str, claims: str) -> str:
    return (f"{containers}.exists(c, has(c.resources) && ("
            f"(has(c.resources.limits) && c.resources.limits.exists(k, {_gpu_resource('k')})) || "
            f"(has(c.resources.requests) && c.resources.requests.exists(k, {_gpu_resource('k')})))) || "
            f"size({claims}) > 0")


def _queue_name(obj: str) -> str:
    """The LocalQueue Kueue queues the object's pods by, read where Kueue 0.19 reads it: a Pod's and a Job's own
    label, a CronJob's job template, a Deployment's or StatefulSet's own label (else their pods', which Kueue then
    queues one by one), and a ReplicaSet's or DaemonSet's pod template (Kueue manages neither; their pods are plain
    pods to it)."""
    own = _labels(obj)
    cron = _template_labels(f"{obj}.spec.jobTemplate")
    template = _template_labels(f"{obj}.spec.template")
    return (f"({obj}.kind in ['Pod', 'Job'] ? {_label(own, QUEUE_LABEL)} : "
            f"{obj}.kind == 'CronJob' ? {_label(cron, QUEUE_LABEL)} : "
            f"{obj}.kind in ['Deployment', 'StatefulSet'] && '{QUEUE_LABEL}' in {own} ? {own}['{QUEUE_LABEL}'] : "
            f"{_label(template, QUEUE_LABEL)})")


def _has_gate(spec: str) -> str:
    return f"(has({spec}.schedulingGates) && {spec}.schedulingGates.exists(g, g.name == '{KUEUE_GATE}'))"


def _suspended(obj: str) -> str:
    return f"({obj}.kind == 'Job' && has({obj}.spec.suspend) && {obj}.spec.suspend)"


# Fields only some kinds have are read in variables: the API server type-checks each validation against every
# kind the policy matches (and warns of `spec.suspend` on a Pod), however the expression guards the kind.
_QUEUE_VARIABLES = [
    {"name": "gpu", "expression": _asks_for_gpus("variables.containers", "variables.resourceClaims")},
    {"name": "oldGpu", "expression": _asks_for_gpus("variables.oldContainers", "variables.oldResourceClaims")},
    {"name": "queueName", "expression": _queue_name("object")},
    {"name": "oldQueueName", "expression": f"variables.isUpdate ? {_queue_name('oldObject')} : ''"},
    {"name": "gated", "expression": _has_gate("variables.podSpec")},
    {"name": "wasGated", "expression": f"variables.isUpdate && {_has_gate('variables.oldPodSpec')}"},
    {"name": "suspended", "expression": _suspended("object")},
    {"name": "wasSuspended", "expression": f"variables.isUpdate && {_suspended('oldObject')}"},
]
_QUEUE_HOW = (f"label it {QUEUE_LABEL}: {LOCAL_QUEUE} (a Pod, Job, Deployment or StatefulSet itself, a CronJob's "
              "jobTemplate, a ReplicaSet's or DaemonSet's pod template)")
_WAITING = "`kubectl get workloads -n <namespace>` shows why the workload waits"


def _controlled_by(obj: str, kind: str, api_group: str = "") -> str:
    group = f" && o.apiVersion.startsWith('{api_group}/')" if api_group else ""
    return (f"has({obj}.metadata.ownerReferences) && {obj}.metadata.ownerReferences.exists(o, "
            f"has(o.controller) && o.controller && o.kind == '{kind}'{group})")


def _queue_policy(kueue: str, jobset: str | None = None) -> dict[str, Any]:
    """Kueue holds a tenant's GPU quota, its borrowing and the online work's reclaim: GPU work runs through it.
    `jobset` is the JobSet controller's user name (jobset_user; the release manifest's by default)."""
    # A pod of a Job, which Kueue leaves ungated and unlabelled: the Job it comes from was judged and queued.
    job_pod = (f"object.kind == 'Pod' && request.operation == 'CREATE' && "
               f"request.userInfo.username in {_strings(JOB_CONTROLLER_USERS)} && {_controlled_by('object', 'Job')}")
    # A Job of a JobSet, which Kueue queues (and suspends and resumes) as a whole: the JobSet controller creates its
    # Jobs unlabelled and resumes them once Kueue resumed the JobSet (gpushare-jobsets-queued judges the JobSet).
    jobset_job = (f"object.kind == 'Job' && request.userInfo.username == {_lit(jobset or jobset_user())} && "
                  f"{_controlled_by('object', 'JobSet', JOBSET_API_GROUP)}")
    return {
        "variables": [*_QUEUE_VARIABLES, {"name": "jobPod", "expression": job_pod},
                      {"name": "jobSetJob", "expression": jobset_job}],
        "validations": [
            {
                "expression": "!variables.gpu || variables.jobPod || variables.jobSetJob || "
                              f"variables.queueName == '{LOCAL_QUEUE}' || "
                              "(variables.isUpdate && variables.oldGpu && variables.queueName == "
                              "variables.oldQueueName)",
                "message": "GPU workloads in tenant namespaces run through Kueue, which holds the tenant's quota, "
                           f"borrowing and priority: {_QUEUE_HOW}",
                "reason": "Forbidden",
            },
            {
                # Kueue's webhook gates the pods it manages; a pod of a Job comes from the Job controller instead
                # (a pod whose ownerReferences a tenant wrote would otherwise look like one to Kueue).
                "expression": "object.kind != 'Pod' || request.operation != 'CREATE' || !variables.gpu || "
                              "variables.gated || variables.jobPod",
                "message": f"a GPU pod starts gated by Kueue ({KUEUE_GATE}, added by Kueue's webhook) until Kueue "
                           "admits it; this one is not, so no queue would count it: "
                           f"{_QUEUE_HOW}, and set no ownerReferences on pods you create (a Job's pods come from "
                           "the Job controller)",
                "reason": "Forbidden",
            },
            {
                "expression": "object.kind != 'Job' || request.operation != 'CREATE' || !variables.gpu || "
                              "variables.suspended || variables.jobSetJob",
                "message": "a GPU Job starts suspended until Kueue admits it (Kueue's webhook suspends the Jobs "
                           f"labelled {QUEUE_LABEL}); this one is not, so it would run outside the queue: label the "
                           f"Job {QUEUE_LABEL}: {LOCAL_QUEUE} and leave spec.suspend to Kueue",
                "reason": "Forbidden",
            },
            {
                "expression": "object.kind != 'Pod' || !variables.wasGated || variables.gated || "
                              f"request.userInfo.username == {_lit(kueue)}",
                "message": f"only Kueue lifts its scheduling gate {KUEUE_GATE}, when it admits the workload: leave "
                           f"spec.schedulingGates as they are ({_WAITING})",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.wasSuspended || variables.suspended || "
                              "!(variables.gpu || variables.oldQueueName != '') || variables.jobSetJob || "
                              f"request.userInfo.username == {_lit(kueue)}",
                "message": "only Kueue resumes a queued Job (spec.suspend: false), when it admits it: leave "
                           f"spec.suspend to Kueue ({_WAITING})",
                "reason": "Forbidden",
            },
        ],
    }


# ---- JobSets: queued as a whole by Kueue's JobSet integration (their own policy: only JobSets have replicatedJobs)
JOBSETS_POLICY = "gpushare-jobsets-queued"
JOBSET_RULES = [{"apiGroups": [JOBSET_API_GROUP], "apiVersions": ["v1alpha2"], "resources": ["jobsets"],
                 "operations": ["CREATE", "UPDATE"]}]


def _jobset_specs(obj: str) -> str:
    return f"{obj}.spec.replicatedJobs.map(r, r.template.spec.template.spec)"


def _jobset_gpu(obj: str) -> str:
    containers = "s.containers + (has(s.initContainers) ? s.initContainers : [])"
    claims = "(has(s.resourceClaims) ? s.resourceClaims : [])"
    return f"{_jobset_specs(obj)}.exists(s, {_asks_for_gpus(f'({containers})', claims)})"


def _jobset_suspended(obj: str) -> str:
    return f"(has({obj}.spec.suspend) && {obj}.spec.suspend)"


def jobsets_policy(kueue: str) -> dict[str, Any]:
    """A GPU JobSet names the tenant's LocalQueue and starts suspended (Kueue's webhook suspends the JobSets labelled
    with a queue); only Kueue resumes it. Its pods are judged by the workload policies when the Job controller
    creates them, its Jobs when the JobSet controller does (their owner is checked by gpushare-gpu-pods-queued)."""
    return {
        "variables": [
            dict(IS_UPDATE),
            {"name": "gpu", "expression": _jobset_gpu("object")},
            {"name": "oldGpu", "expression": f"variables.isUpdate && {_jobset_gpu('oldObject')}"},
            {"name": "queueName", "expression": _label(_labels("object"), QUEUE_LABEL)},
            {"name": "oldQueueName",
             "expression": f"variables.isUpdate ? {_label(_labels('oldObject'), QUEUE_LABEL)} : ''"},
            {"name": "suspended", "expression": _jobset_suspended("object")},
            {"name": "wasSuspended", "expression": f"variables.isUpdate && {_jobset_suspended('oldObject')}"},
        ],
        "validations": [
            {
                "expression": f"!variables.gpu || variables.queueName == '{LOCAL_QUEUE}' || "
                              "(variables.isUpdate && variables.oldGpu && variables.queueName == "
                              "variables.oldQueueName)",
                "message": "GPU JobSets in tenant namespaces run through Kueue, which holds the tenant's quota, "
                           f"borrowing and priority: label the JobSet {QUEUE_LABEL}: {LOCAL_QUEUE}",
                "reason": "Forbidden",
            },
            {
                "expression": "request.operation != 'CREATE' || !variables.gpu || variables.suspended",
                "message": "a GPU JobSet starts suspended until Kueue admits it (Kueue's webhook suspends the "
                           f"JobSets labelled {QUEUE_LABEL}); this one is not, so it would run outside the queue: "
                           f"label it {QUEUE_LABEL}: {LOCAL_QUEUE} and leave spec.suspend to Kueue",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.wasSuspended || variables.suspended || "
                              "!(variables.gpu || variables.oldQueueName != '') || "
                              f"request.userInfo.username == {_lit(kueue)}",
                "message": "only Kueue resumes a queued JobSet (spec.suspend: false), when it admits it: leave "
                           f"spec.suspend to Kueue ({_WAITING})",
                "reason": "Forbidden",
            },
        ],
    }
