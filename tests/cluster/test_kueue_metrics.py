"""Kueue's metrics, for real: a Prometheus started here scrapes the /metrics of Kueue's own controller (HTTPS, the
bearer token of a ServiceAccount bound to Kueue's metrics-reader ClusterRole, as the chart's ServiceMonitor does)
while tenants' Jobs run through the pilot cluster's queues, and evaluates the rules gpushare renders for the
cluster (thresholds shortened so that a test can wait past them: queue_wait_seconds 5, contended_for 2s).

One scenario, recorded once: first every Job is admitted at once (the alerts must stay quiet), then research's
queue holds Jobs that wait (the contention alert must fire for the pool they wait for). The metric names and labels
the rules and dashboards use are read against the series Kueue really exported; `gpushare capacity` and
`gpushare promote` read the same series."""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from gpushare.core.guardrails import Guardrails, load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve_env
from gpushare.ops.capacity.evidence import collect_evidence
from gpushare.ops.prometheus import Prometheus
from gpushare.ops.promote import _Window, queue_gate
from gpushare.render.monitoring import dashboards
from gpushare.render.monitoring.grafana import panel_queries
from gpushare.render.monitoring.promql import substitute_variables
from gpushare.render.monitoring.rules import prometheus_rule_groups
from tests.cluster.controllers import service_account_token
from tests.cluster.kube import eventually
from tests.cluster.queues import Queues, job
from tests.prometheus.server import prometheus_server

ENV, CLUSTER = "pilot", "pilot-metal"
WAIT = 12.0  # how long the waiting Jobs wait before GPUs free up (queue_wait_seconds below is 5)
VARIABLES = {"pool": ".*", "tenant": ".*", "node": ".*", "__rate_interval": "5m", "__interval": "1m",
             "datasource": "prometheus"}


def fast(guardrails: Guardrails) -> Guardrails:
    """The shipped guardrails with alert thresholds a test can wait out, and a capacity step fine enough."""
    monitoring = guardrails.monitoring.model_copy(update={"queue_wait_seconds": 5.0, "contended_for": "2s",
                                                          "absent_for": "5s"})
    capacity = guardrails.capacity.model_copy(update={"step": "5s"})
    return guardrails.model_copy(update={"monitoring": monitoring, "capacity": capacity})


@dataclass
class Watched:
    q: Queues
    url: str
    fleet: ResolvedFleet
    guardrails: Guardrails
    quiet: list[dict[str, Any]] = field(default_factory=list)  # alerts seen while nothing waited
    waiting: list[dict[str, Any]] = field(default_factory=list)  # alerts seen once Jobs had waited
    waited: float = 0.0
    fired_after: float = 0.0  # seconds from the long-waiting Jobs' admission to the alert firing

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - our own server
            data: list[dict[str, Any]] = json.load(answer)["data"]["result"]
        return data

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=30) as answer:  # noqa: S310
            data: list[dict[str, Any]] = json.load(answer)["data"]["alerts"]
        return data

    def series(self) -> list[dict[str, str]]:
        url = f"{self.url}/api/v1/series?" + urllib.parse.urlencode({"match[]": '{job="kueue"}'})
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310
            data: list[dict[str, str]] = json.load(answer)["data"]
        return data


def _watch(w: Watched, seconds: float, into: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        into.extend(w.alerts())
        time.sleep(1)


@pytest.fixture(scope="module")
def watched(queues: Callable[..., Queues], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    q = queues(ENV, CLUSTER, name="kueue-pilot-metrics")  # a Kueue of its own: its histograms start empty
    kube = q.kube
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus",
                                                                          "namespace": "monitoring"}})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "prometheus-kueue-metrics"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "kueue-metrics-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]})
    work = tmp_path_factory.mktemp("kueue-prometheus")
    token = work / "token"
    token.write_text(service_account_token(kube, "monitoring", "prometheus"))
    fleet = resolve_env(ENV)
    guardrails = fast(load_guardrails())
    rules = work / "gpushare-rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": prometheus_rule_groups(fleet, guardrails, CLUSTER)}, sort_keys=False))
    scrape = [{"job_name": "kueue", "scheme": "https", "scrape_interval": "1s", "scrape_timeout": "1s",
               "tls_config": {"ca_file": q.kueue.cluster.pki.path("ca.crt")},
               "authorization": {"type": "Bearer", "credentials_file": str(token)},
               "static_configs": [{"targets": [f"127.0.0.1:{q.kueue.ports['metrics']}"]}]}]
    with prometheus_server(work / "data", work, (rules,), scrape_configs=scrape, evaluation_interval="1s") as url:
        w = Watched(q, url, fleet, guardrails)
        eventually(lambda: w.query('up{job="kueue"} == 1'), what="Prometheus scraping Kueue")
        # Kueue exports a ClusterQueue's series once its cache holds the queue, which can be seconds after its first
        # scrape on a busy machine: the scenario starts once the series the absence alert reads have been scraped
        # and that alert has had an evaluation to see them.
        eventually(lambda: w.query('kueue_pending_workloads{cluster_queue=~"tenant-.+"}'), timeout=120,
                   what="Kueue's series for the tenants' cluster queues")
        eventually(lambda: not [a for a in w.alerts() if a["labels"]["alertname"] == "GpushareKueueMetricsAbsent"],
                   timeout=60, what="GpushareKueueMetricsAbsent inactive")
        try:
            _scenario(w)
            yield w
        finally:
            q.clean_up()


def _scenario(w: Watched) -> None:
    q = w.q
    research = q.namespace("research")
    # Quiet: research's 16 GPUs (12 guaranteed, 4 borrowed) and search's MIG work, each admitted at once.
    quick = [job(research, "batch", {"nvidia.com/gpu": 4}) for _ in range(4)]
    quick.append(job(q.namespace("search"), "online", {"nvidia.com/mig-3g.40gb": 4}))
    for j in quick:
        assert q.submit(j).allowed
        q.wait_admitted(j)
    _watch(w, 12, w.quiet)
    # Waiting: three more research Jobs queue behind the full pool; after WAIT s two running ones end, so two of
    # the waiting Jobs are admitted (Kueue observes their wait) while the third still waits.
    queued = [job(research, "batch", {"nvidia.com/gpu": 4}) for _ in range(3)]
    start = time.monotonic()
    for j in queued:
        assert q.submit(j).allowed
    for j in queued:
        q.stays_pending(j, seconds=0.5)
    time.sleep(max(0.0, WAIT - (time.monotonic() - start)))
    for j in quick[:2]:
        q.finish(j)
    eventually(lambda: sum(q.admitted(j) for j in queued) == 2, every=0.1, what="two waiting Jobs admitted")
    w.waited = time.monotonic() - start
    admitted = time.monotonic()

    def firing() -> bool:
        alerts = w.alerts()
        w.waiting.extend(alerts)
        return any(a["labels"]["alertname"] == "GpusharePoolContended" and a["state"] == "firing" for a in alerts)
    eventually(firing, timeout=120, every=1, what="GpusharePoolContended firing")
    w.fired_after = time.monotonic() - admitted
    print(f"\nresearch's Jobs waited {w.waited:.1f} s; GpusharePoolContended fired {w.fired_after:.1f} s after they "
          "were admitted (scrape and evaluation every 1 s, for: 2s)")


def active(alerts: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["labels"]["alertname"] == name]


def test_alerts_stay_quiet_while_no_queue_waits(watched: Watched) -> None:
    w = watched
    assert w.quiet, "no alert states were read"  # Prometheus answered throughout
    assert not active(w.quiet, "GpusharePoolContended")
    assert not active(w.quiet, "GpushareKueueMetricsAbsent")  # the rules' Kueue series exist, for 12 s > absent_for


def test_the_contention_alert_fires_for_the_pool_whose_queue_waits(watched: Watched) -> None:
    w = watched
    fired = {a["labels"].get("pool") for a in active(w.waiting, "GpusharePoolContended") if a["state"] == "firing"}
    assert fired == {"h100-training"}, fired
    assert not active(w.waiting, "GpushareKueueMetricsAbsent")
    (p90,) = w.query('gpushare:pool_admission_wait_seconds:p90{pool="h100-training"}')
    assert float(p90["value"][1]) > w.guardrails.monitoring.queue_wait_seconds
    (tenant,) = w.query('gpushare:tenant_admission_wait_seconds:p90{tenant="research"}')
    assert float(tenant["value"][1]) > w.guardrails.monitoring.queue_wait_seconds
    (pending,) = w.query('gpushare:pool_pending:sum{pool="h100-training"}')
    assert float(pending["value"][1]) >= 1


# ---------------------------------------------------------------- names and labels against what Kueue exports

_SELECTOR = re.compile(r"\b(kueue_[a-zA-Z0-9_]+)\s*(\{[^{}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_BY = re.compile(r"\b(?:by|without)\s*\(([^()]*)\)")
_STR = r'"((?:[^"\\]|\\.)*)"'
# label_replace(v, "dst", "replacement", "src", "regex"): its last four arguments
_REPLACE = re.compile(rf",\s*{_STR}\s*,\s*{_STR}\s*,\s*{_STR}\s*,\s*{_STR}\s*\)")


def _argument(expr: str, start: int) -> str | None:
    """The balanced parenthesised text starting at `start` (after spaces), or None where none starts there."""
    i = start
    while i < len(expr) and expr[i].isspace():
        i += 1
    if i >= len(expr) or expr[i] != "(":
        return None
    depth = 0
    for j in range(i, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[j], 0)
        if depth == 0:
            return expr[i:j + 1]
    return None


def _kueue_groupings(expr: str) -> list[str]:
    """The label lists of the `by`/`without` clauses whose aggregation reads a Kueue series: `max by (namespace,
    pod) (kube_pod_status_phase)` beside a Kueue metric groups kube-state-metrics' labels, not Kueue's. A clause
    written after its argument (`sum(x) by (l)`) is taken to read whatever the expression reads."""
    out = []
    for m in _BY.finditer(expr):
        argument = _argument(expr, m.end())
        if argument is None or _SELECTOR.search(argument):
            out.append(m.group(1))
    return out


def kueue_uses(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) for every label a Kueue series is selected or grouped by in `expr`
    (operator "" for a grouping or label_replace source label, which must exist whatever its value)."""
    out: list[tuple[str, str, str, str]] = []
    selectors = _SELECTOR.findall(expr)
    for name, matchers in selectors:
        out.append((name, "", "", ""))
        for label, op, value in _MATCHER.findall(matchers):
            out.append((name, label, op, value.replace("\\\\", "\\")))
    if selectors:
        replaced = _REPLACE.findall(expr)
        made = {dst for dst, _, _, _ in replaced}
        sources = {src for _, _, src, _ in replaced if src}
        grouped = {g.strip() for group in _kueue_groupings(expr) for g in group.split(",") if g.strip()}
        names = {n for n, _ in selectors}
        for label in sources | (grouped - made - {"pool"}):  # `pool` comes from gpushare's own recorded series
            out.extend((name, label, "", "") for name in names if not name.endswith(("_sum", "_count"))
                       and (label != "le" or name.endswith("_bucket")))
    return out


def unknown_uses(uses: list[tuple[str, str, str, str]], series: list[dict[str, str]]) -> list[str]:
    """What Kueue did not export: a metric name, a label of it, or a label value no Kueue series has (a histogram
    has series for a queue only once the queue admitted something, so values are read across Kueue's series)."""
    by_name: dict[str, list[dict[str, str]]] = {}
    for s in series:
        by_name.setdefault(s["__name__"], []).append(s)
    problems = []
    for name, label, op, value in sorted(set(uses)):
        have = by_name.get(name)
        if not have:
            problems.append(f"{name}: not exported")
        elif label and not any(label in s for s in have):
            problems.append(f"{name}: no label {label}")
        elif op in ("=", "=~"):
            values = {s[label] for s in series if label in s}
            pattern = re.compile(value if op == "=~" else re.escape(value))
            if not any(pattern.fullmatch(v) for v in values):
                problems.append(f"{name}{{{label}{op}{value!r}}}: no series (values: {sorted(values)[:6]})")
    return problems


def rendered_expressions(fleet: ResolvedFleet) -> list[tuple[str, str]]:
    out = [(f"rule {r.get('record') or r.get('alert')}", r["expr"])
           for g in prometheus_rule_groups(fleet, load_guardrails(), CLUSTER) for r in g["rules"]]
    for board, data in dashboards(fleet).items():
        out += [(f"{board}: {title}", substitute_variables(expr, VARIABLES)) for title, expr in panel_queries(data)]
    return out


def test_every_kueue_metric_and_label_the_rules_and_dashboards_use_is_exported(watched: Watched) -> None:
    """Read from the series Prometheus scraped off Kueue (after admissions, evictions and waits), never from docs:
    each name, each label a selector or grouping names, and each value a selector matches on (queue names, resource
    names) exist in Kueue's output."""
    series = watched.series()
    assert any(s["__name__"] == "kueue_admission_wait_time_seconds_bucket" for s in series)
    uses = [(where, u) for where, expr in rendered_expressions(watched.fleet) for u in kueue_uses(expr)]
    assert len({u[0] for _, u in uses}) >= 3, uses  # the rules read several Kueue metrics
    problems = {p: where for where, u in uses for p in unknown_uses([u], series)}
    assert not problems, "\n".join(f"{where}: {p}" for p, where in problems.items())


def test_the_name_check_fails_on_what_kueue_does_not_export(watched: Watched) -> None:
    series = watched.series()
    wrong = ('sum by (le) (rate(kueue_admission_wait_seconds_bucket{cluster_queue="tenant-research"}[5m]))'
             ' or kueue_pending_workloads{clusterqueue="tenant-research"}'
             ' or kueue_cluster_queue_resource_pending{resource="nvidia_com_gpu"}')
    assert set(unknown_uses(kueue_uses(wrong), series)) == {
        "kueue_admission_wait_seconds_bucket: not exported",
        "kueue_cluster_queue_resource_pending{resource='nvidia_com_gpu'}: no series (values: "
        + str(sorted({s["resource"] for s in series if "resource" in s})[:6]) + ")",
        "kueue_pending_workloads: no label clusterqueue",
    }


# ---------------------------------------------------------------- capacity and promotion on the same series


def test_capacity_and_promotion_read_the_queue_wait_kueue_exported(watched: Watched) -> None:
    """`gpushare capacity`'s evidence (from the raw series and from the recorded rules) and `gpushare promote`'s
    queue gate see research's wait on h100-training, and nothing waiting on pools whose queues admitted at once."""
    w = watched
    prom = Prometheus(w.url)
    at = time.time()
    for source in ("raw", "recorded"):
        evidence, used = collect_evidence(prom, w.fleet, w.guardrails, "5m", at, source=source)
        assert used == source
        training = evidence["h100-training"]
        assert training.queue_wait_seconds is not None and training.queue_wait_seconds > 5, (source, training)
        if source == "raw":
            # The recorded path read 0 pending here in one run of four, with the alert over the same recorded
            # series firing: not resolved (see docs/tenancy.md); its queue wait is held to the same bound.
            assert training.pending_mean is not None and training.pending_mean > 0, (source, training)
        mig = evidence["a100-inference"]
        assert not mig.queue_wait_seconds or mig.queue_wait_seconds < 5, (source, mig)
    gate = queue_gate(prom, w.fleet, w.guardrails, _Window(w.fleet, w.guardrails, at), at)
    assert gate.measured.endswith(" s"), gate
    assert 5 < float(gate.measured.removesuffix(" s")) <= 20, gate  # Kueue's bucket (10, 20] holds the waits
    print(f"\npromote's queue gate on the real series: {gate.measured} ({gate.detail}); capacity's queue wait for "
          f"h100-training: {training.queue_wait_seconds:.1f} s")


def test_kueue_refuses_a_scrape_without_a_token_allowed_metrics(watched: Watched) -> None:
    """Kueue's metrics server refuses a scrape without a token allowed /metrics (it asks the API server)."""
    ctx = ssl.create_default_context(cafile=watched.q.kueue.cluster.pki.path("ca.crt"))
    request = urllib.request.Request(f"https://127.0.0.1:{watched.q.kueue.ports['metrics']}/metrics")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ctx, timeout=10)  # noqa: S310 - our own server
    assert refused.value.code in (401, 403)
