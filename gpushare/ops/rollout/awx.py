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

Every answer is read through a typed model before gpushare acts on it (the launch prompts, the launch, the job's
status, each page of host summaries and failed events): an answer that is not JSON (a login page), cut off, nested
deeper than any AWX answer, or of another shape is refused with the job (or job template) and the field it concerns,
exit 2, and a job whose state it leaves unknown is canceled. Every wait is bounded: each request by --timeout
(connection to last byte, gpushare/ops/http.py), a job's run by --awx-job-timeout (the job is canceled past it), the
pages by MAX_PAGES.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from pathlib import Path
from typing import IO, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.ops.http import Client, Refused, TimedOut, TooLarge
from gpushare.ops.rollout.adapters import HostOutcome, host_outcome
from gpushare.ops.timeouts import AWX_JOB_TIMEOUT, DEFAULT_TIMEOUT, TIMEOUT_FIX

TOKEN_ENV = "CONTROLLER_OAUTH_TOKEN"  # the variable awxkit (the `awx` CLI) reads the controller's token from
FINISHED = {"successful", "failed", "error", "canceled"}
SUMMARY_FIELDS = {"ok": "ok", "changed": "changed", "failures": "failures", "dark": "dark", "skipped": "skipped"}
DEFAULT_PORTS = {"http": 80, "https": 443}
URL_FIX = "give the controller's address, e.g. https://awx.example.com or https://awx.example.com:8443"
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # one AWX answer: a page of 200 events with their results is a few MB at most
MAX_DEPTH = 100  # JSON nesting of one AWX answer: its own objects are a few levels, a task's result some more
MAX_PAGES = 500  # of one list (200 items a page): 100,000 host summaries or failed events
AWX_POLL_INTERVAL = 5.0  # seconds between two looks at a running job's state (each one request to the controller)
ANSWER_FIX = ("check that --awx-url is the controller's own address (not a proxy's, a login page's or another "
              "service's) and that the token in $" + TOKEN_ENV + " is accepted there")


# ---------------------------------------------------------------- what AWX answers, as gpushare reads it

class _Answer(BaseModel):
    """An AWX API object: the fields gpushare reads are typed strictly (no "12" for 12, no true for 1); the others
    are kept as they came."""

    model_config = ConfigDict(extra="allow", strict=True)


JobId = Annotated[int, Field(ge=1, le=2**63 - 1)]
Count = Annotated[int, Field(ge=0, le=10**9)]
JobStatus = Literal["new", "pending", "waiting", "running", "successful", "failed", "error", "canceled"]


class LaunchPrompts(_Answer):
    """GET job_templates/<id>/launch/: what the template asks for on launch."""

    ask_limit_on_launch: bool
    ask_variables_on_launch: bool


class Launched(_Answer):
    """POST job_templates/<id>/launch/: the job started (AWX gives its number as `job` and as `id`)."""

    WHOLE: ClassVar[str] = "job"  # the field an error of the whole answer concerns
    job: JobId | None = None
    id: JobId | None = None
    ignored_fields: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _a_job(self) -> Launched:
        if self.job is None and self.id is None:
            raise ValueError("no job number (neither `job` nor `id`)")
        if self.job is not None and self.id is not None and self.job != self.id:
            raise ValueError(f"`job` {self.job} and `id` {self.id} name different jobs")
        return self

    @property
    def number(self) -> int:
        number = self.job if self.job is not None else self.id
        assert number is not None  # _a_job
        return number


class JobState(_Answer):
    """GET jobs/<id>/: the job's status."""

    status: JobStatus


class Page(_Answer):
    """One page of a list: its items (each read by its own model) and the next page's address."""

    results: list[Any]
    next: str | None = None


class HostSummary(_Answer):
    """One host's counts in a job (job_host_summaries)."""

    host_name: Annotated[str, Field(min_length=1)]
    ok: Count = 0
    changed: Count = 0
    failures: Count = 0
    dark: Count = 0
    skipped: Count = 0


class EventData(_Answer):
    host: str = ""
    task: str = ""
    ignore_errors: bool | None = None
    rescued: bool | int | None = None
    res: dict[str, Any] = Field(default_factory=dict)


class FailedEvent(_Answer):
    """One runner_on_failed or runner_on_unreachable event (job_events), as ansible-runner gave it to AWX."""

    event: str
    event_data: EventData = Field(default_factory=EventData)


Model = TypeVar("Model", bound=BaseModel)


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _depth_above(doc: Any, limit: int) -> bool:
    """Whether the JSON document nests lists and objects more than `limit` deep (without recursion)."""
    stack = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


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
    """`PLAYBOOK=ID` pairs (rollout.yml=12 verify.yml=13): the job template that runs each playbook; each playbook
    once, each with its own template, the ID in the digits 0-9."""
    fix = "give --awx-template rollout.yml=ID --awx-template verify.yml=ID, the job templates' numbers"
    out: dict[str, int] = {}
    for value in values:
        name, _, number = value.partition("=")
        if name not in ("rollout.yml", "verify.yml"):
            raise GpushareError(Problem(f"{value[:80]!r}: {name[:40]!r} is not a playbook a rollout launches "
                                        "(rollout.yml or verify.yml)", path="--awx-template", fix=fix), exit_code=2)
        if not re.fullmatch(r"[0-9]{1,18}", number) or int(number) == 0:
            raise GpushareError(Problem(f"{value[:80]!r}: the job template ID {number[:40]!r} is not a number from "
                                        "1 written in the digits 0-9", path="--awx-template", fix=fix), exit_code=2)
        if name in out:
            raise GpushareError(Problem(f"{name} is given twice ({name}={out[name]} and {value}); one would silently "
                                        "win", path="--awx-template", fix=f"give {name} once"), exit_code=2)
        out[name] = int(number)
    missing = {"rollout.yml", "verify.yml"} - set(out)
    if missing:
        raise GpushareError(Problem(f"no job template for {', '.join(sorted(missing))}", path="--awx-template",
                                    fix=fix), exit_code=2)
    if out["rollout.yml"] == out["verify.yml"]:
        raise GpushareError(Problem(f"rollout.yml and verify.yml both name job template {out['rollout.yml']}; a job "
                                    "template runs one playbook, so one of the two would run the other's",
                                    path="--awx-template", fix="give each playbook its own job template"),
                            exit_code=2)
    return out


class AwxBackend:
    """An AnsibleRunner whose playbook runs are jobs of an AWX / automation controller."""

    def __init__(self, url: str, templates: dict[str, int], logs: Path, token: str | None = None,
                 extra_vars: dict[str, Any] | None = None, poll_interval: float = AWX_POLL_INTERVAL,
                 timeout: float = AWX_JOB_TIMEOUT, request_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = controller_url(url)
        where = origin(self.url)
        assert where is not None  # controller_url refuses anything without one
        self.origin = where  # the only place the token goes, redirects included
        self._client = Client(_SameOriginRedirects(where))
        self.templates = templates
        self.logs = logs
        self.token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        self.extra_vars = extra_vars or {}
        self.poll_interval = poll_interval
        self.timeout = timeout  # a job's run, launch to end (--awx-job-timeout)
        self.request_timeout = request_timeout  # one request, connection to last byte (--timeout)
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

    def _call(self, method: str, path: str, what: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON of one request's answer (what: the job or job template it concerns, named in every refusal),
        within --timeout, MAX_ANSWER_BYTES and MAX_DEPTH."""
        url = self._absolute(path)
        if origin(url) != self.origin:
            raise self._elsewhere(f"AWX {method} {path}: the request would go to", url)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Content-Type": "application/json", "Accept": "application/json",
            **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        kind: list[str] = []
        started = time.monotonic()
        try:
            raw = self._client.fetch(request, started + self.request_timeout, MAX_ANSWER_BYTES,
                                     on_open=lambda r: kind.append(str(r.headers.get("Content-Type") or "")))
        except _Elsewhere as exc:
            raise self._elsewhere(f"AWX {method} {path}: redirected to", exc.url) from None
        except Refused as exc:
            detail = exc.body.decode(errors="replace")[:500]
            raise GpushareError(Problem(f"AWX {method} {path}: HTTP {exc.code} {detail}", file=what,
                                        fix=f"check --awx-url, the job templates and ${TOKEN_ENV}"),
                                exit_code=2) from None
        except TimedOut as exc:
            got = f"{exc.received} bytes of an answer" if exc.received else "no answer"
            raise GpushareError(Problem(f"AWX {method} {path}: {got} within {exc.waited:.0f} s, gpushare's bound on "
                                        f"one request (--timeout {self.request_timeout:g} s, from the connection to "
                                        "the answer's last byte)", file=what,
                                        fix="check that the controller at --awx-url is up and that nothing between "
                                            f"(a proxy) holds the connection open; {TIMEOUT_FIX}"),
                                exit_code=2) from None
        except TooLarge:
            raise self._shape(what, method, path, None, f"more than {MAX_ANSWER_BYTES} bytes") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise GpushareError(Problem(f"AWX {method} {path}: {reason}", file=what, fix="check --awx-url"),
                                exit_code=2) from None
        if not raw.strip():
            return {}  # 202 Accepted of a cancel, 204 No Content
        try:
            doc = json.loads(raw)
        except RecursionError:
            raise self._shape(what, method, path, None, "JSON nested deeper than any AWX answer") from None
        except ValueError as exc:
            content = (kind or [""])[0].split(";")[0] or "no Content-Type"
            start = raw[:60].decode(errors="replace").replace("\n", " ")
            why = (f"not JSON but {content} ({start!r}...): a login page or a proxy's answer, not the API's"
                   if "json" not in content else f"JSON cut off or broken ({exc}; {len(raw)} bytes)")
            raise self._shape(what, method, path, None, why) from None
        if _depth_above(doc, MAX_DEPTH):
            raise self._shape(what, method, path, None, f"JSON nested more than {MAX_DEPTH} levels deep")
        return doc

    def _shape(self, what: str, method: str, path: str, field: str | None, why: str) -> GpushareError:
        """A refusal of an answer: naming the job or job template (what), and the field where one is wrong."""
        message = f"{why}, in the answer to AWX {method} {path}" if field else f"AWX {method} {path} answered {why}"
        return GpushareError(Problem(message, file=what, path=field, fix=ANSWER_FIX), exit_code=2)

    def _read(self, model: type[Model], doc: Any, what: str, method: str, path: str,
              prefix: tuple[int | str, ...] = ()) -> Model:
        """`doc` as `model`, or a refusal naming the job (what) and the field."""
        try:
            return model.model_validate(doc)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = _field((*prefix, *error["loc"]))
            if not field and error["type"] == "value_error":  # a check of the whole object: the field it concerns
                field = _field((*prefix, getattr(model, "WHOLE", "")))
            got = json.dumps(error.get("input"), default=str)[:80] if "input" in error else ""
            msg = str(error["msg"]).removeprefix("Value error, ")
            if field:
                raise self._shape(what, method, path, field, msg + (f" (it holds {got})" if got else "")) from None
            raise self._shape(what, method, path, None, f"{got or 'something'}: {msg}") from None

    def _get(self, model: type[Model], path: str, what: str) -> Model:
        return self._read(model, self._call("GET", path, what), what, "GET", path)

    def _pages(self, model: type[Model], path: str, what: str) -> list[Model]:
        """Every page's results as `model`, following `next`: a path (AWX's form) is under --awx-url, anything else
        is read against the page; it must be within the origin, not a page already read (a loop), and within
        MAX_PAGES."""
        out: list[Model] = []
        page = self._absolute(path)
        read: set[str] = set()
        while True:
            read.add(urllib.parse.urldefrag(page).url)
            doc = self._read(Page, self._call("GET", page, what), what, "GET", page)
            out.extend(self._read(model, item, what, "GET", page, prefix=("results", i))
                       for i, item in enumerate(doc.results))
            nxt = doc.next or ""
            if not nxt:
                return out
            following = self.url + nxt if nxt.startswith("/") else urllib.parse.urljoin(page, nxt)
            if origin(following) != self.origin:
                raise self._elsewhere(f"AWX GET {page}: its next page is", following)
            if urllib.parse.urldefrag(following).url in read:
                raise GpushareError(Problem(f"AWX GET {page}: its next page {following} was already read; the "
                                            "pages loop, so the job's results are not complete", file=what,
                                            path="next",
                                            fix="check the controller (or a proxy in front of it) at --awx-url"),
                                    exit_code=2)
            if len(read) >= MAX_PAGES:
                raise GpushareError(Problem(f"AWX GET {path}: more than {MAX_PAGES} pages; the list does not end",
                                            file=what, path="next",
                                            fix="check the controller (or a proxy in front of it) at --awx-url"),
                                    exit_code=2)
            page = following

    def launch_body(self, hosts: list[str], label: str) -> dict[str, Any]:
        """What the job launch takes: the batch's hosts as the limit, and as extra_vars the rollout's variables and
        the run's label (rollout, batch and playbook), which the controller's job list then shows."""
        return {"limit": ",".join(hosts), "extra_vars": {**self.extra_vars, "gpushare_rollout_run": label}}

    def _cancel(self, job: int) -> str:
        """Ask the controller to cancel the job: what happened, for the message."""
        try:
            self._call("POST", f"/api/v2/jobs/{job}/cancel/", f"AWX job {job}", {})
        except GpushareError as err:
            return (f"canceling it failed ({err.problems[0].message[:200]}): cancel it on the controller, "
                    f"{self.url}/#/jobs/playbook/{job}")
        return "it was canceled"

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
            ) -> dict[str, HostOutcome]:
        template = self.templates[playbook]
        what = f"AWX job template {template} ({playbook})"
        launch = f"/api/v2/job_templates/{template}/launch/"
        # The job template must take both from the launch (AWX's "Prompt on launch"), or the batch would run on
        # the template's own limit: refuse before launching.
        asks = self._get(LaunchPrompts, launch, what)
        if not (asks.ask_limit_on_launch and asks.ask_variables_on_launch):
            raise GpushareError(Problem(f"AWX job template {template} ({playbook}) does not prompt for the limit and "
                                        "the variables on launch", fix="enable Prompt on launch for Limit and "
                                        "Variables on the job template"), exit_code=2)
        body = self.launch_body(hosts, label)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / f"{label}.launch.json").write_text(json.dumps({"job_template": template, **body}, indent=1))
        launched = self._read(Launched, self._call("POST", launch, what, body), what, "POST", launch)
        job = launched.number
        self.jobs.append(job)
        if launched.ignored_fields:
            self._call("POST", f"/api/v2/jobs/{job}/cancel/", f"AWX job {job}", {})
            raise GpushareError(Problem(f"AWX job {job} ignored {sorted(launched.ignored_fields)}; it was "
                                        "canceled", fix="enable Prompt on launch for Limit and Variables"),
                                exit_code=2)
        what = f"AWX job {job} ({playbook})"
        status: str | None = None
        try:
            deadline = time.monotonic() + self.timeout
            status = self._get(JobState, f"/api/v2/jobs/{job}/", what).status
            while status not in FINISHED and time.monotonic() < deadline:
                time.sleep(max(0.0, min(self.poll_interval, deadline - time.monotonic())))
                status = self._get(JobState, f"/api/v2/jobs/{job}/", what).status
            cancel = ""
            if status not in FINISHED:  # past --awx-job-timeout: the batch stops here, and so does the job
                cancel = self._cancel(job)
            summaries = self._pages(HostSummary, f"/api/v2/jobs/{job}/job_host_summaries/?page_size=200", what)
            query = urllib.parse.urlencode({"event__in": "runner_on_failed,runner_on_unreachable",
                                            "page_size": 200})
            events = self._pages(FailedEvent, f"/api/v2/jobs/{job}/job_events/?{query}", what)
        except GpushareError as err:
            if status in FINISHED:
                raise
            # The job may still run: it is asked to stop, so that nothing goes on that the journal does not know.
            first = err.problems[0]
            raise GpushareError([Problem(f"{first.message}; the job's state is unknown, so {self._cancel(job)}",
                                         file=first.file, line=first.line, path=first.path, fix=first.fix),
                                 *err.problems[1:]], exit_code=err.exit_code) from None
        log = self.logs / f"{label}.job.json"
        log.write_text(json.dumps({"job": job, "status": status,
                                   "host_summaries": [s.model_dump(mode="json") for s in summaries],
                                   "failed_events": [e.model_dump(mode="json") for e in events]}, indent=1))
        stats = {key: {s.host_name: getattr(s, field) for s in summaries} for field, key in SUMMARY_FIELDS.items()}
        event_dicts = [e.model_dump() for e in events]
        outcomes = {}
        for host in hosts:
            outcome = host_outcome(host, stats, event_dicts, playbook, gate, log)
            outcome.job = f"{self.url}/#/jobs/playbook/{job}"
            if status not in FINISHED and not outcome.message:
                outcome.ok, outcome.gate = False, gate
                outcome.message = (f"AWX job {job} did not finish within --awx-job-timeout {self.timeout:g} s; "
                                   f"{cancel}")
            elif not outcome.ok:
                outcome.message = f"AWX job {job}: {outcome.message}"
            outcomes[host] = outcome
        return outcomes
