"""Batches handed to AWX or Ansible Automation Platform's automation controller instead of local ansible-runner.

Per batch, one job launch on the job template of the playbook (rollout.yml, then verify.yml as the gate): the
launch body is what the controller's REST API takes (`POST /api/v2/job_templates/<id>/launch/` with `limit` and
`extra_vars`), kept beside the journal as `<label>.launch.json`. The job is polled until it ends; its host summaries
and failed events (`/api/v2/jobs/<id>/job_host_summaries/`, `.../job_events/`) are read back into the same host
outcomes local runs give, so the journal, the gates and resume work alike. A job template that would ignore the
limit or the variables is refused before anything runs: a canary batch must not become the whole fleet.

The token goes only to the origin of --awx-url (scheme, host and port, the host's case and a default port
normalised): a redirect or a page's `next` link to any other origin is refused before anything is sent there, and so
is a `next` link back to a page already read (a loop).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from pathlib import Path
from typing import IO, Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.ops.rollout.adapters import HostOutcome, host_outcome

TOKEN_ENV = "CONTROLLER_OAUTH_TOKEN"  # the variable awxkit (the `awx` CLI) reads the controller's token from
FINISHED = {"successful", "failed", "error", "canceled"}
SUMMARY_FIELDS = {"ok": "ok", "changed": "changed", "failures": "failures", "dark": "dark", "skipped": "skipped"}
DEFAULT_PORTS = {"http": 80, "https": 443}
URL_FIX = "give the controller's address, e.g. https://awx.example.com or https://awx.example.com:8443"


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the scheme and host in lower case and a left-out port as its
    scheme's default; None for anything else (another scheme, no host, a port that is not one)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def show_origin(where: tuple[str, str, int]) -> str:
    scheme, host, port = where
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + ("" if port == DEFAULT_PORTS[scheme] else f":{port}")


def controller_url(url: str) -> str:
    """--awx-url as the controller's address: http(s), a host, perhaps a port and a path; no spaces or other
    characters a URL cannot carry, no user or password, query or fragment. Returned without a trailing slash."""
    def bad(why: str, fix: str = URL_FIX) -> GpushareError:
        return GpushareError(Problem(f"--awx-url {url!r} is not an http(s) URL with a host: {why}", path="--awx-url",
                                     fix=fix), exit_code=2)

    if any(not (32 < ord(c) < 127) for c in url):
        raise bad("it has a space, a control character or a character outside ASCII")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise bad(str(exc)) from None
    if parts.scheme.lower() not in DEFAULT_PORTS:
        raise bad("give it with https:// (or http://)")
    if not parts.hostname:
        raise bad("no host")
    if parts.username is not None or parts.password is not None:
        raise bad("a user or password in the address", fix=f"leave it out; the token comes from ${TOKEN_ENV}")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise bad("a query or fragment (?, #)")
    return url.rstrip("/")


class _Elsewhere(Exception):
    """A redirect to another origin than --awx-url's, not followed."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the origin, where the token may go; a 307 or 308 keeps the method and the body
    (urllib's own handler refuses those for a POST)."""

    def __init__(self, allowed: tuple[str, str, int]) -> None:
        self.allowed = allowed

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: HTTPMessage, newurl: str) -> urllib.request.Request | None:
        if origin(newurl) != self.allowed:
            fp.close()
            raise _Elsewhere(newurl)
        if code in (307, 308) and req.get_method() not in ("GET", "HEAD"):
            return urllib.request.Request(newurl, data=req.data, headers=dict(req.headers),
                                          origin_req_host=req.origin_req_host, unverifiable=True,
                                          method=req.get_method())
        return super().redirect_request(req, fp, code, msg, headers, newurl)


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
        self.url = controller_url(url)
        where = origin(self.url)
        assert where is not None  # controller_url refuses anything without one
        self.origin = where  # the only place the token goes, redirects included
        self._opener = urllib.request.build_opener(_SameOriginRedirects(where))
        self.templates = templates
        self.logs = logs
        self.token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        self.extra_vars = extra_vars or {}
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.jobs: list[int] = []

    def _elsewhere(self, what: str, url: str) -> GpushareError:
        return GpushareError(Problem(
            f"{what} {url}, outside the origin of --awx-url, {show_origin(self.origin)}: not followed, since the "
            f"${TOKEN_ENV} token is sent only there", path="--awx-url",
            fix="give --awx-url as the controller's own address (scheme, host and port), the one it answers on"),
            exit_code=2)

    def _absolute(self, path: str) -> str:
        """A path under --awx-url, or an absolute http(s) URL as it is."""
        return path if urllib.parse.urlsplit(path).scheme else self.url + path

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self._absolute(path)
        if origin(url) != self.origin:
            raise self._elsewhere(f"AWX {method} {path}: the request would go to", url)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Content-Type": "application/json", "Accept": "application/json",
            **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with self._opener.open(request, timeout=60) as response:
                doc: dict[str, Any] = json.loads(response.read() or b"{}")
                return doc
        except _Elsewhere as exc:
            raise self._elsewhere(f"AWX {method} {path}: redirected to", exc.url) from None
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise GpushareError(Problem(f"AWX {method} {path}: HTTP {exc.code} {detail}",
                                        fix=f"check --awx-url, the job templates and ${TOKEN_ENV}"),
                                exit_code=2) from None
        except (urllib.error.URLError, OSError) as exc:
            raise GpushareError(Problem(f"AWX {method} {path}: {exc}", fix="check --awx-url"), exit_code=2) from None

    def _pages(self, path: str) -> list[dict[str, Any]]:
        """Every page's results, following `next`: a path (AWX's form) is under --awx-url, anything else is read
        against the page; it must be within the origin, and not a page already read (a loop)."""
        out: list[dict[str, Any]] = []
        page = self._absolute(path)
        read: set[str] = set()
        while True:
            read.add(urllib.parse.urldefrag(page).url)
            doc = self._call("GET", page)
            out.extend(doc.get("results", []))
            nxt = str(doc.get("next") or "")
            if not nxt:
                return out
            following = self.url + nxt if nxt.startswith("/") else urllib.parse.urljoin(page, nxt)
            if origin(following) != self.origin:
                raise self._elsewhere(f"AWX GET {page}: its next page is", following)
            if urllib.parse.urldefrag(following).url in read:
                raise GpushareError(Problem(f"AWX GET {page}: its next page {following} was already read; the "
                                            "pages loop, so the job's results are not complete",
                                            fix="check the controller (or a proxy in front of it) at --awx-url"),
                                    exit_code=2)
            page = following

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
