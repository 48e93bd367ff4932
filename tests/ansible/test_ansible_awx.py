"""`gpushare rollout --awx-url`'s refusals, against the AWX stand-in (no test hosts: the jobs launched here end at once
without running a playbook). The rollout through it for real is in test_ansible_rollout.py. The token goes only to
the origin of --awx-url: a redirect or a `next` link to another server on 127.0.0.1 (another port, another origin)
is refused, and that server records that nothing reached it."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.ops.rollout import adapters
from gpushare.ops.rollout.awx import AwxBackend, parse_templates
from tests.ansible.awx_standin import AwxStandIn, JobTemplate, OtherOrigin
from tests.conftest import ROOT

ENV = ROOT / "environments" / "pilot.yaml"


def standin(tmp_path: Path, **asks: bool) -> AwxStandIn:
    templates = {5: JobTemplate("rollout.yml", ENV, **asks), 6: JobTemplate("verify.yml", ENV)}
    return AwxStandIn(templates, dict, tmp_path)


def test_a_job_template_that_would_ignore_the_limit_is_refused_before_any_launch(tmp_path: Path) -> None:
    with standin(tmp_path, ask_limit=False) as awx:
        backend = AwxBackend(awx.url, {"rollout.yml": 5, "verify.yml": 6}, tmp_path / "logs", token=awx.token)
        with pytest.raises(GpushareError) as err:
            backend.run("rollout.yml", ENV, ["pilot-a100-01"], "r-batch1-rollout", "converge")
        assert "Prompt on launch" in str(err.value.problems[0].fix)
        assert awx.launches == [] and backend.jobs == []


def test_a_wrong_token_is_an_error_that_names_the_variable(tmp_path: Path) -> None:
    with standin(tmp_path) as awx:
        backend = AwxBackend(awx.url, {"rollout.yml": 5, "verify.yml": 6}, tmp_path / "logs", token="wrong")
        with pytest.raises(GpushareError) as err:
            backend.run("rollout.yml", ENV, ["pilot-a100-01"], "r-batch1-rollout", "converge")
        assert "HTTP 401" in err.value.problems[0].message
        assert "CONTROLLER_OAUTH_TOKEN" in str(err.value.problems[0].fix)
        assert awx.launches == []


def test_the_launch_body_is_the_batch_s_limit_and_variables() -> None:
    backend = AwxBackend("https://awx.example.com/", {}, Path("."), token="t", extra_vars={"site": "a"})
    assert backend.launch_body(["h1", "h2"], "dev-1-batch2-rollout") == {
        "limit": "h1,h2", "extra_vars": {"site": "a", "gpushare_rollout_run": "dev-1-batch2-rollout"}}


@pytest.mark.parametrize("values", [[], ["rollout.yml=1"], ["site.yml=1", "verify.yml=2"], ["rollout.yml=x"]])
def test_both_job_templates_are_required(values: list[str]) -> None:
    with pytest.raises(GpushareError):
        parse_templates(values)
    assert parse_templates(["rollout.yml=3", "verify.yml=4"]) == {"rollout.yml": 3, "verify.yml": 4}


@pytest.mark.parametrize("args", [["--awx-template", "rollout.yml=1"],
                                  ["--awx-url", "awx.example.com", "--awx-template", "rollout.yml=1",
                                   "--awx-template", "verify.yml=2"],
                                  ["--awx-url", "https://awx.example.com", "--awx-template", "rollout.yml=1"],
                                  # The controller's execution environment decides the strategy, not this machine.
                                  ["--awx-url", "https://awx.example.com", "--awx-template", "rollout.yml=1",
                                   "--awx-template", "verify.yml=2", "--mitogen"]])
def test_rollout_refuses_incomplete_awx_options_as_bad_input(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["rollout", "--env", "pilot", "--dry-run", *args])
    assert result.exit_code == 2, result.output
    if "--mitogen" in args:
        assert "--mitogen with --awx-url" in result.output and "gpushare_strategy=mitogen_free" in result.output


LAUNCH = "/api/v2/job_templates/5/launch/"
SUMMARIES = "/api/v2/jobs/1/job_host_summaries/?page_size=200"


def rollout(awx: AwxStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    """`gpushare rollout --awx-url` on the pilot environment as its console script runs it (gpushare.cli.main, the
    exit-code boundary), the Pulumi steps confirmed as run: (exit code, its --json output)."""
    from gpushare.cli import main

    monkeypatch.setattr(adapters.PulumiRunner, "available", staticmethod(lambda: False))  # never a real Pulumi
    monkeypatch.setenv("CONTROLLER_OAUTH_TOKEN", awx.token)
    try:
        main(["rollout", "--env", str(ENV), "--journal", str(tmp_path / "state" / "journal.jsonl"),
              "--pulumi-confirmed", "--awx-url", awx.url, "--awx-template", "rollout.yml=5", "--awx-template",
              "verify.yml=6", "--json", *extra])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{"):]) if "{" in out else {}


@pytest.mark.parametrize("how", ["redirect", "next"])
def test_the_token_never_leaves_the_origin_of_the_awx_url(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with OtherOrigin() as other, AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)},
                                            dict, tmp_path, play=False) as awx:
        if how == "redirect":  # the first call, before anything is launched
            elsewhere = other.url + LAUNCH
            awx.redirects["GET " + LAUNCH] = elsewhere
        else:  # the first batch's job has run; its host summaries' second page is on the other server
            elsewhere = other.url + "/api/v2/jobs/1/job_host_summaries/?page=2&page_size=200"
            awx.next_links[SUMMARIES] = elsewhere
        code, doc = rollout(awx, tmp_path, monkeypatch, capsys)
    assert other.authorizations() == [], "the token went to another origin"
    assert other.received == [], "a request went to another origin"
    assert code == 2, doc
    message = doc["errors"][0]
    assert elsewhere in message and f"outside the origin of --awx-url, {awx.url}" in message, message
    # Refused at the first batch: before its launch (the redirect), or after its converge job ran (the link).
    assert [(la["job_template"], la["limit"]) for la in awx.launches] == (
        [] if how == "redirect" else [(5, "pilot-a100-01")])


def test_a_redirect_within_the_origin_is_followed_with_the_token(tmp_path: Path) -> None:
    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        # The same origin, written otherwise (the scheme in capitals): the prompt's GET by a 302, and the launch's
        # POST by a 307, which keeps the method and the body.
        same = awx.url.replace("http://", "HTTP://")
        awx.redirects["GET " + LAUNCH] = same + LAUNCH + "?via=302"
        awx.redirects["POST " + LAUNCH] = (307, same + LAUNCH + "?via=307")
        backend = AwxBackend(awx.url, {"rollout.yml": 5, "verify.yml": 6}, tmp_path / "logs", token=awx.token,
                             poll_interval=0.01)
        outcomes = backend.run("rollout.yml", ENV, ["pilot-a100-01"], "r-batch1-rollout", "converge")
    assert outcomes["pilot-a100-01"].ok, outcomes
    assert ("GET", LAUNCH + "?via=302", True) in awx.requests and ("POST", LAUNCH + "?via=307", True) in awx.requests
    assert [(la["job_template"], la["limit"]) for la in awx.launches] == [(5, "pilot-a100-01")]


def test_a_next_link_back_to_a_page_already_read_is_refused(tmp_path: Path) -> None:
    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        second = "/api/v2/jobs/1/job_host_summaries/?page=2&page_size=200"
        awx.next_links[SUMMARIES] = second
        awx.next_links[second] = awx.url + SUMMARIES  # back to the first page, as an absolute URL
        backend = AwxBackend(awx.url, {"rollout.yml": 5, "verify.yml": 6}, tmp_path / "logs", token=awx.token,
                             poll_interval=0.01)
        with pytest.raises(GpushareError) as err:
            backend.run("rollout.yml", ENV, ["pilot-a100-01"], "r-batch1-rollout", "converge")
    message = err.value.problems[0].message
    assert "already read" in message and awx.url + SUMMARIES in message, message
    assert err.value.exit_code == 2
    assert awx.pages_served == 2  # the first page and the second, once each


def test_the_origin_is_compared_after_normalising_the_scheme_the_host_and_default_ports() -> None:
    from gpushare.ops.rollout.awx import origin

    assert origin("HTTPS://AWX.Example.COM:443/api/v2/") == origin("https://awx.example.com") \
        == ("https", "awx.example.com", 443)
    assert origin("http://awx.example.com:80/") == origin("http://awx.example.com")
    assert origin("http://[::1]:8080/x") == ("http", "::1", 8080)
    for other in ("http://awx.example.com", "https://awx.example.com:8443", "https://awx.example.com.evil.test",
                  "https://evil.test/awx.example.com"):
        assert origin(other) != origin("https://awx.example.com"), other


@pytest.mark.parametrize("url", ["https://awx example.com", "https://awx.example.com\t", "https://",
                                 "http:///api/v2", "https://awx.example.com:port", "https://awx.example.com:99999",
                                 "https://[::1", "https://user:secret@awx.example.com",
                                 "https://awx.example.com/?x=1", "https://awx.example.com/#jobs"])
def test_an_awx_url_that_is_not_an_http_s_address_with_a_host_is_bad_input(url: str) -> None:
    result = CliRunner().invoke(app, ["rollout", "--env", "pilot", "--dry-run", "--awx-url", url, "--awx-template",
                                      "rollout.yml=1", "--awx-template", "verify.yml=2"])
    assert result.exit_code == 2, result.output
    assert "--awx-url" in result.output, result.output


# ---------------------------------------------------------------- answers gpushare does not expect (issue 39, item 6)

JOB = "/api/v2/jobs/1/"
EVENTS = ("/api/v2/jobs/1/job_events/?event__in=runner_on_failed%2Crunner_on_unreachable&page_size=200")


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """A hang is a failure, not a stuck suite: SIGALRM raises in the test's thread after `seconds` (the CLI's
    boundary then turns it into its internal-error exit, 70, which no test here expects)."""
    def ring(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _json(doc: Any) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(doc).encode()


LOGIN_PAGE = (200, "text/html; charset=utf-8", b"<!DOCTYPE html><html><head><title>Login</title></head></html>")
DEEP = b'{"id": 1, "status": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

# (what, request answered otherwise, the answer, what the refusal names: the job or template, then the field)
UNEXPECTED = [
    ("a login page for the launch", "POST " + LAUNCH, LOGIN_PAGE,
     ["AWX job template 5 (rollout.yml)", "not JSON but text/html", "'<!DOCTYPE html>"]),
    ("cut-off JSON for the launch", "POST " + LAUNCH, (201, "application/json", b'{"job": 1, "id": 1, "sta'),
     ["AWX job template 5 (rollout.yml)", "JSON cut off"]),
    ("a launch answer of []", "POST " + LAUNCH, _json([]),
     ["AWX job template 5 (rollout.yml)", "answered []: Input should be a valid dictionary"]),
    ("a launch answer without a job id", "POST " + LAUNCH, _json({"status": "pending"}),
     ["AWX job template 5 (rollout.yml): job: no job number"]),
    ("a job id that is not a number", "POST " + LAUNCH, _json({"job": "seven", "id": "seven"}),
     ["AWX job template 5 (rollout.yml)", ": job:", "valid integer", '"seven"']),
    ("a launch prompt that is a login page", "GET " + LAUNCH, LOGIN_PAGE,
     ["AWX job template 5 (rollout.yml)", "not JSON but text/html"]),
    ("a status nested 100,000 levels deep", "GET " + JOB, (200, "application/json", DEEP),
     ["AWX job 1 (rollout.yml)", "nested deeper", "it was canceled"]),
    ("a job without status", "GET " + JOB, _json({"id": 1, "failed": False}),
     ["AWX job 1 (rollout.yml)", ": status:", "Field required", "it was canceled"]),
    ("a status AWX does not have", "GET " + JOB, _json({"id": 1, "status": "done-ish"}),
     ["AWX job 1 (rollout.yml)", ": status:", "'successful'", "it was canceled"]),
    ("a host summary without host_name", "GET " + SUMMARIES, _json({"results": [{"ok": 1, "failures": 0}]}),
     ["AWX job 1 (rollout.yml)", ": results[0].host_name:", "Field required"]),
    ("a host summary with a count that is not a number", "GET " + SUMMARIES,
     _json({"results": [{"host_name": "pilot-a100-01", "ok": 1, "failures": "many"}]}),
     ["AWX job 1 (rollout.yml)", ": results[0].failures:", "valid integer", '"many"']),
    ("a failed event that is not an object", "GET " + EVENTS, _json({"results": ["boom"], "next": None}),
     ["AWX job 1 (rollout.yml)", ": results[0]:", "valid dictionary"]),
    ("a page without results", "GET " + SUMMARIES, _json({"count": 1, "next": None}),
     ["AWX job 1 (rollout.yml)", ": results:", "Field required"]),
]


@pytest.mark.parametrize(("what", "request_line", "answer", "said"), UNEXPECTED, ids=[u[0] for u in UNEXPECTED])
def test_an_answer_awx_would_not_give_is_refused_naming_the_job_and_the_field(
        what: str, request_line: str, answer: tuple[int, str, bytes], said: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each answer read through its typed model: exit 2 (never 70, never a hang), the job (or, before a job exists,
    the job template) and the field named, with a fix; a job whose state is unknown is canceled, and no later batch
    is launched."""
    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        awx.answers[request_line] = answer
        started = time.monotonic()
        with within(60):
            code, doc = rollout(awx, tmp_path, monkeypatch, capsys)
        elapsed = time.monotonic() - started
    assert code == 2, (code, doc)
    assert elapsed < 30, elapsed  # a refusal, not a wait (a job without status was polled for 6 hours)
    message = doc["errors"][0]
    for words in said:
        assert words in message, (words, message)
    assert doc["problems"][0]["fix"], doc
    launched = [(la["job_template"], la["limit"]) for la in awx.launches]
    assert launched == ([] if request_line.startswith(("POST", "GET " + LAUNCH)) else [(5, "pilot-a100-01")])
    cancels = [r for r in awx.requests if r[0] == "POST" and r[1] == "/api/v2/jobs/1/cancel/"]
    assert len(cancels) == ("it was canceled" in said[-1]), awx.requests


@pytest.mark.parametrize("value", ["rollout.yml=²", "rollout.yml=١٢", "rollout.yml=", "rollout.yml=0",
                                   "rollout.yml=-3", "rollout.yml=99999999999999999999", "site.yml=3"])
def test_an_awx_template_id_that_is_not_a_number_in_ascii_digits_is_bad_input(value: str) -> None:
    """`isdigit()` takes '²' and Arabic-Indic digits, which int() refuses or reads: a located error, exit 2."""
    from gpushare.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["rollout", "--env", str(ENV), "--dry-run", "--json", "--awx-url", "https://awx.example.com",
              "--awx-template", value, "--awx-template", "verify.yml=6"])
    assert exit_.value.code == 2


def test_an_awx_template_id_in_other_digits_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    result = CliRunner().invoke(app, ["rollout", "--env", "pilot", "--dry-run", "--json", "--awx-url",
                                      "https://awx.example.com", "--awx-template", "rollout.yml=²",
                                      "--awx-template", "verify.yml=6"])
    assert result.exit_code == 2, result.output
    problem = json.loads(result.stdout)["problems"][0]
    assert problem["path"] == "--awx-template" and "'²' is not a number" in problem["message"], problem


@pytest.mark.parametrize(("values", "said"), [
    (["rollout.yml=5", "rollout.yml=7", "verify.yml=6"], "rollout.yml is given twice (rollout.yml=5 and "
                                                         "rollout.yml=7)"),
    (["rollout.yml=5", "verify.yml=5"], "both name job template 5"),
])
def test_a_playbook_given_twice_or_one_template_for_both_is_refused(values: list[str], said: str) -> None:
    """The last of two --awx-template rollout.yml=... silently won; now neither does."""
    args = [a for v in values for a in ("--awx-template", v)]
    result = CliRunner().invoke(app, ["rollout", "--env", "pilot", "--dry-run", "--json", "--awx-url",
                                      "https://awx.example.com", *args])
    assert result.exit_code == 2, result.output
    problem = json.loads(result.stdout)["problems"][0]
    assert problem["path"] == "--awx-template" and said in problem["message"], problem


def test_a_job_that_keeps_running_is_canceled_at_the_awx_job_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--awx-job-timeout bounds the wait for a job (its default was 6 hours, and no option set it): past it the job
    is canceled, its hosts fail (exit 1) with the job named, and the rollout stops after the batch."""
    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        awx.answers["GET " + JOB] = _json({"id": 1, "status": "running"})
        started = time.monotonic()
        with within(60):
            code, doc = rollout(awx, tmp_path, monkeypatch, capsys, "--awx-job-timeout", "1")
        elapsed = time.monotonic() - started
    assert code == 1, doc
    assert elapsed < 20, elapsed
    failure = doc["failures"][0] if "failures" in doc else doc
    text = json.dumps(failure)
    assert "AWX job 1 did not finish within --awx-job-timeout 1 s; it was canceled" in text, doc
    assert ("POST", "/api/v2/jobs/1/cancel/", True) in awx.requests
    assert [(la["job_template"], la["limit"]) for la in awx.launches] == [(5, "pilot-a100-01")]


@pytest.mark.parametrize("how", ["silent", "trickle"])
def test_a_controller_that_does_not_answer_is_given_up_at_the_timeout(
        how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--timeout bounds each request from the connection to the last byte: a controller that accepts and stays
    silent, or sends a byte every 0.1 s (within any socket timeout), ends the rollout in about that long, exit 2."""
    def slow(handler: BaseHTTPRequestHandler) -> None:
        if how == "silent":
            time.sleep(60)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "600")
        handler.end_headers()
        for _ in range(600):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.1)

    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        awx.answers["GET " + LAUNCH] = slow
        started = time.monotonic()
        with within(60):
            code, doc = rollout(awx, tmp_path, monkeypatch, capsys, "--timeout", "1.5")
        elapsed = time.monotonic() - started
    assert code == 2, doc
    assert elapsed < 15, elapsed
    message = doc["errors"][0]
    assert "AWX job template 5 (rollout.yml)" in message and "--timeout 1.5 s" in message, message
    assert ("bytes of an answer" if how == "trickle" else "no answer within") in message, message
    assert awx.launches == []


def test_a_next_link_to_the_same_page_is_refused(tmp_path: Path) -> None:
    with AwxStandIn({5: JobTemplate("rollout.yml", ENV), 6: JobTemplate("verify.yml", ENV)}, dict, tmp_path,
                    play=False) as awx:
        awx.next_links[SUMMARIES] = SUMMARIES
        backend = AwxBackend(awx.url, {"rollout.yml": 5, "verify.yml": 6}, tmp_path / "logs", token=awx.token,
                             poll_interval=0.01)
        with pytest.raises(GpushareError) as err:
            backend.run("rollout.yml", ENV, ["pilot-a100-01"], "r-batch1-rollout", "converge")
    problem = err.value.problems[0]
    assert "already read" in problem.message and problem.file == "AWX job 1 (rollout.yml)", problem
    assert problem.path == "next" and awx.pages_served == 1
