"""Batches handed to AWX or Ansible Automation Platform's automation controller instead of local ansible-runner.

Per batch, one job launch on the job template of the playbook (rollout.yml, then verify.yml as the gate): the
launch body is what the controller's REST API takes (`POST /api/v2/job_templates/<id>/launch/` with `limit` and
`extra_vars`), kept beside the journal as `<label>.launch.json`. The job is polled until it ends; its host summaries
and failed events (`/api/v2/jobs/<id>/job_host_summaries/`, `.../job_events/`) are read back into the same host
outcomes local runs give, so the journal, the gates and resume work alike. A job template that would ignore the
limit or the variables is refused before anything runs: a canary batch must not become the whole fleet.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.ops.rollout.adapters import HostOutcome, host_outcome

TOKEN_ENV = "CONTROLLER_OAUTH_TOKEN"  # the variable awxkit (the `awx` CLI) reads the controller's token from
FINISHED = {"successful", "failed", "error", "canceled"}
SUMMARY_FIELDS = {"ok": "ok", "changed": "changed", "failures": "failures", "dark": "dark", "skipped": "skipped"}


def parse_templates(values: list[str]) -> dict[str, int]:
    """`PLAYBOOK=ID` pairs (rollout.yml=12 verify.yml=13): the job template that runs each playbook."""
    out: dict[str, int] = {}
    for value in values:
        name, _, number = value.partition("=")
        if not number.isdigit() or name not in ("rollout.yml", "verify.yml"):
            raise GpushareError(Problem(f"--awx-template {value!r}", path="--awx-template",
                                        fix="give rollout.yml=ID and verify.yml=ID, the job templates' numbers"),
                                exit_code=2)
        out[name] = int(number)
    missing = {"rollout.yml", "verify.yml"} - set(out)
    if missing:
        raise GpushareError(Problem(f"no job template for {', '.join(sorted(missing))}", path="--awx-template",
                                    fix="give --awx-template rollout.yml=ID --awx-template verify.yml=ID"),
                            exit_code=2)
    return out


class AwxBackend:
    """An AnsibleRunner whose playbook runs are jobs of an AWX / automation controller."""

    def __init__(self, url: str, templates: dict[str, int], logs: Path, token: str | None = None,
                 extra_vars: dict[str, Any] | None = None, poll_interval: float = 5.0,
                 timeout: float = 6 * 3600.0) -> None:
        self.url = url.rstrip("/")
        self.templates = templates
        self.logs = logs
        self.token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        self.extra_vars = extra_vars or {}
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.jobs: list[int] = []

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = path if path.startswith("http") else self.url + path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Content-Type": "application/json", "Accept": "application/json",
            **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - the URL the user gave
                doc: dict[str, Any] = json.loads(response.read() or b"{}")
                return doc
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise GpushareError(Problem(f"AWX {method} {path}: HTTP {exc.code} {detail}",
                                        fix=f"check --awx-url, the job templates and ${TOKEN_ENV}"),
                                exit_code=2) from None
        except (urllib.error.URLError, OSError) as exc:
            raise GpushareError(Problem(f"AWX {method} {path}: {exc}", fix="check --awx-url"), exit_code=2) from None

    def _pages(self, path: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page: str | None = path
        while page:
            doc = self._call("GET", page)
            out.extend(doc.get("results", []))
            nxt = doc.get("next")
            page = None if not nxt else nxt if str(nxt).startswith("http") else self.url + str(nxt) \
                if str(nxt).startswith("/") else None
        return out

    def launch_body(self, hosts: list[str], label: str) -> dict[str, Any]:
        """What the job launch takes: the batch's hosts as the limit, and as extra_vars the rollout's variables and
        the run's label (rollout, batch and playbook), which the controller's job list then shows."""
        return {"limit": ",".join(hosts), "extra_vars": {**self.extra_vars, "gpushare_rollout_run": label}}

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
            ) -> dict[str, HostOutcome]:
        template = self.templates[playbook]
        # The job template must take both from the launch (AWX's "Prompt on launch"), or the batch would run on
        # the template's own limit: refuse before launching.
        asks = self._call("GET", f"/api/v2/job_templates/{template}/launch/")
        if not (asks.get("ask_limit_on_launch") and asks.get("ask_variables_on_launch")):
            raise GpushareError(Problem(f"AWX job template {template} ({playbook}) does not prompt for the limit and "
                                        "the variables on launch", fix="enable Prompt on launch for Limit and "
                                        "Variables on the job template"), exit_code=2)
        body = self.launch_body(hosts, label)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / f"{label}.launch.json").write_text(json.dumps({"job_template": template, **body}, indent=1))
        launched = self._call("POST", f"/api/v2/job_templates/{template}/launch/", body)
        job = int(launched.get("job") or launched["id"])
        self.jobs.append(job)
        if launched.get("ignored_fields"):
            self._call("POST", f"/api/v2/jobs/{job}/cancel/", {})
            raise GpushareError(Problem(f"AWX job {job} ignored {sorted(launched['ignored_fields'])}; it was "
                                        "canceled", fix="enable Prompt on launch for Limit and Variables"),
                                exit_code=2)
        deadline = time.monotonic() + self.timeout
        status = self._call("GET", f"/api/v2/jobs/{job}/")
        while status.get("status") not in FINISHED and time.monotonic() < deadline:
            time.sleep(self.poll_interval)
            status = self._call("GET", f"/api/v2/jobs/{job}/")
        summaries = self._pages(f"/api/v2/jobs/{job}/job_host_summaries/?page_size=200")
        query = urllib.parse.urlencode({"event__in": "runner_on_failed,runner_on_unreachable", "page_size": 200})
        events = self._pages(f"/api/v2/jobs/{job}/job_events/?{query}")
        log = self.logs / f"{label}.job.json"
        log.write_text(json.dumps({"job": job, "status": status.get("status"), "host_summaries": summaries,
                                   "failed_events": events}, indent=1))
        stats = {key: {s["host_name"]: int(s.get(field) or 0) for s in summaries}
                 for field, key in SUMMARY_FIELDS.items()}
        outcomes = {}
        for host in hosts:
            outcome = host_outcome(host, stats, events, playbook, gate, log)
            outcome.job = f"{self.url}/#/jobs/playbook/{job}"
            if status.get("status") not in FINISHED and not outcome.message:
                outcome.ok, outcome.gate = False, gate
                outcome.message = f"AWX job {job} did not finish in {self.timeout:g} s"
            elif not outcome.ok:
                outcome.message = f"AWX job {job}: {outcome.message}"
            outcomes[host] = outcome
        return outcomes
