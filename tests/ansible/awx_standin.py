"""A local stand-in for AWX / automation controller's job API (no AWX runs here), for `gpushare rollout --awx-url`.

It serves, on 127.0.0.1, the calls gpushare makes, shaped as AWX's REST API v2 answers them: a job template's launch
(GET: what it prompts for; POST: `limit` and `extra_vars`, as AWX takes them), the job's status, its host summaries
and its events. A launched job runs the job template's playbook from this checkout's collection with ansible-runner,
as an AWX execution node does, against the template's inventory (an environment file through the inventory plugin),
with the launch's limit and extra vars merged over the template's own variables. Every launch body is kept in
`launches` for the tests to read, and every request (method, path, whether it carried an Authorization header) in
`requests`.

For the tests of where the token may go: `redirects` answers a request ("GET /path?query") with a 302 (or the
status given) to another address, before any authentication, as a proxy in front of a controller would;
`next_links` gives a page's `next` link by its request path; `play=False` ends each launched job at once as
successful on every host of its limit, without running the playbook. `OtherOrigin` is the second server such a
redirect or link points to, on another port of 127.0.0.1 (another origin): it keeps what it is sent.

For the tests of answers gpushare does not expect: `answers` replaces the answer to a request ("METHOD path?query",
after authentication) with (status, Content-Type, body bytes), or with a function that writes the answer itself on
the handler (silence, a trickle); a POST's launch is then not made.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import ansible_runner

from tests.ansible.testbed import ROOT

MAX_PAGES = 50


@dataclass
class JobTemplate:
    playbook: str  # in the collection's playbooks/
    inventory: Path
    extra_vars: dict[str, Any] = field(default_factory=dict)  # the template's own (credentials would inject these)
    ask_limit: bool = True
    ask_variables: bool = True


@dataclass
class Job:
    id: int
    template: int
    status: str = "pending"
    summaries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class AwxStandIn:
    def __init__(self, templates: dict[int, JobTemplate], envvars: Callable[[], dict[str, str]], workdir: Path,
                 token: str = "standin-token", forks: int = 10, play: bool = True) -> None:
        self.templates, self.envvars, self.workdir, self.token, self.forks = templates, envvars, workdir, token, forks
        self.play = play
        self.jobs: dict[int, Job] = {}
        self.launches: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, with an Authorization header)
        self.redirects: dict[str, str | tuple[int, str]] = {}  # "METHOD path" -> Location (a 302) or (status, it)
        self.next_links: dict[str, str] = {}  # a page's request path -> its `next`
        self.answers: dict[str, tuple[int, str, bytes] | Callable[[BaseHTTPRequestHandler], None]] = {}
        self.pages_served = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AwxStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- a job, as an execution node runs it

    def _run(self, job: Job, limit: str, extra_vars: dict[str, Any]) -> None:
        template = self.templates[job.template]
        if not self.play:
            job.summaries = [{"host_name": h, "ok": 1, "changed": 0, "failures": 0, "dark": 0, "skipped": 0,
                              "rescued": 0, "ignored": 0, "failed": False} for h in limit.split(",") if h]
            job.status = "successful"
            return
        private = self.workdir / f"job-{job.id}"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir(parents=True)
        job.status = "running"
        result = ansible_runner.run(
            private_data_dir=str(private), project_dir=str(ROOT),
            playbook=str(ROOT / "playbooks" / template.playbook), inventory=str(template.inventory),
            envvars=self.envvars(), limit=limit, quiet=True, forks=self.forks,
            extravars={**template.extra_vars, **extra_vars})
        (self.workdir / f"job-{job.id}.log").write_text(result.stdout.read())
        stats = result.stats or {}
        hosts = sorted({h for kind in ("ok", "failures", "dark", "skipped", "changed") for h in stats.get(kind, {})})
        job.summaries = [{"host_name": h, "ok": stats.get("ok", {}).get(h, 0),
                          "changed": stats.get("changed", {}).get(h, 0),
                          "failures": stats.get("failures", {}).get(h, 0), "dark": stats.get("dark", {}).get(h, 0),
                          "skipped": stats.get("skipped", {}).get(h, 0),
                          "rescued": stats.get("rescued", {}).get(h, 0),
                          "ignored": stats.get("ignored", {}).get(h, 0),
                          "failed": bool(stats.get("failures", {}).get(h) or stats.get("dark", {}).get(h))}
                         for h in hosts]
        # AWX stores ansible-runner's events; each carries the event name and its event_data as the runner gave it.
        job.events = [{"id": i, "event": ev.get("event"), "event_data": ev.get("event_data", {}),
                       "host_name": ev.get("event_data", {}).get("host", ""),
                       "task": ev.get("event_data", {}).get("task", "")}
                      for i, ev in enumerate(result.events) if ev.get("event", "").startswith("runner_on_")]
        shutil.rmtree(private, ignore_errors=True)
        job.status = "successful" if result.rc == 0 else "failed"

    # -- the REST API

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _page(self, results: list[dict[str, Any]]) -> None:
                # A `next` link that loops is followed at most MAX_PAGES times here, so that a client that keeps
                # following it ends (as a test failure) instead of running forever.
                with standin.lock:
                    standin.pages_served += 1
                    served = standin.pages_served
                nxt = standin.next_links.get(self.path) if served < MAX_PAGES else None
                self._send(200, {"count": len(results), "next": nxt, "results": results})

            def _redirected(self) -> bool:
                with standin.lock:
                    standin.requests.append((self.command, self.path, "Authorization" in self.headers))
                target = standin.redirects.get(f"{self.command} {self.path}")
                if target is None:
                    return False
                code, location = target if isinstance(target, tuple) else (302, target)
                self.send_response(code)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {standin.token}":
                    return True
                self._send(401, {"detail": "Authentication credentials were not provided."})
                return False

            def _answered(self) -> bool:
                """An answer set in `answers` for this request, sent; False where there is none."""
                answer = standin.answers.get(f"{self.command} {self.path}")
                if answer is None:
                    return False
                try:
                    if callable(answer):
                        answer(self)
                        return True
                    code, content_type, body = answer
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should
                return True

            def _parts(self) -> tuple[list[str], dict[str, list[str]]]:
                url = urllib.parse.urlsplit(self.path)
                return [p for p in url.path.split("/") if p], urllib.parse.parse_qs(url.query)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self._redirected() or not self._authorised() or self._answered():
                    return
                parts, query = self._parts()
                if parts[:3] == ["api", "v2", "job_templates"] and parts[4:] == ["launch"]:
                    template = standin.templates.get(int(parts[3]))
                    if template is None:
                        return self._send(404, {"detail": "Not found."})
                    return self._send(200, {"ask_limit_on_launch": template.ask_limit,
                                            "ask_variables_on_launch": template.ask_variables,
                                            "can_start_without_user_input": True})
                if parts[:3] == ["api", "v2", "jobs"] and len(parts) >= 4:
                    job = standin.jobs.get(int(parts[3]))
                    if job is None:
                        return self._send(404, {"detail": "Not found."})
                    if parts[4:] == []:
                        return self._send(200, {"id": job.id, "status": job.status,
                                                "failed": job.status in ("failed", "error")})
                    if parts[4:] == ["job_host_summaries"]:
                        return self._page(job.summaries)
                    if parts[4:] == ["job_events"]:
                        wanted = set(",".join(query.get("event__in", [])).split(",")) - {""}
                        return self._page([e for e in job.events if not wanted or e["event"] in wanted])
                self._send(404, {"detail": "Not found."})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self._redirected() or not self._authorised() or self._answered():
                    return
                parts, _ = self._parts()
                if parts[:3] == ["api", "v2", "job_templates"] and parts[4:] == ["launch"]:
                    number = int(parts[3])
                    template = standin.templates.get(number)
                    if template is None:
                        return self._send(404, {"detail": "Not found."})
                    ignored = {k: body[k] for k, asked in (("limit", template.ask_limit),
                                                           ("extra_vars", template.ask_variables))
                               if k in body and not asked}
                    with standin.lock:
                        job = Job(id=len(standin.jobs) + 1, template=number)
                        standin.jobs[job.id] = job
                        standin.launches.append({"job_template": number, **body})
                    limit = "" if "limit" in ignored else body.get("limit", "")
                    extra = {} if "extra_vars" in ignored else body.get("extra_vars") or {}
                    threading.Thread(target=standin._run, args=(job, limit, extra), daemon=True).start()
                    return self._send(201, {"job": job.id, "id": job.id, "status": "pending",
                                            "ignored_fields": ignored})
                if parts[:3] == ["api", "v2", "jobs"] and parts[4:] == ["cancel"]:
                    return self._send(202, {})
                self._send(404, {"detail": "Not found."})

        return Handler


class OtherOrigin:
    """Another server on 127.0.0.1, on a port of its own: where a redirect or a `next` link sends the client away
    from the controller. It answers every request with an empty page and keeps what it received (method, path and
    headers) in `received`."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        other = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                other.received.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                       "body": self.rfile.read(length).decode(errors="replace")})
                body = json.dumps({"count": 0, "next": None, "results": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtherOrigin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def authorizations(self) -> list[str]:
        """Every Authorization header it was sent (whatever its case)."""
        return [v for r in self.received for k, v in r["headers"].items() if k.lower() == "authorization"]
