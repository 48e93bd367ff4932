"""`gpushare rollout --awx-url`'s refusals, against the AWX stand-in (no test hosts: the jobs launched here end at once
without running a playbook). The rollout through it for real is in test_ansible_rollout.py. The token goes only to
the origin of --awx-url: a redirect or a `next` link to another server on 127.0.0.1 (another port, another origin)
is refused, and that server records that nothing reached it."""

from __future__ import annotations

import json
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
            capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """`gpushare rollout --awx-url` on the pilot environment as its console script runs it (gpushare.cli.main, the
    exit-code boundary), the Pulumi steps confirmed as run: (exit code, its --json output)."""
    from gpushare.cli import main

    monkeypatch.setattr(adapters.PulumiRunner, "available", staticmethod(lambda: False))  # never a real Pulumi
    monkeypatch.setenv("CONTROLLER_OAUTH_TOKEN", awx.token)
    try:
        main(["rollout", "--env", str(ENV), "--journal", str(tmp_path / "state" / "journal.jsonl"),
              "--pulumi-confirmed", "--awx-url", awx.url, "--awx-template", "rollout.yml=5", "--awx-template",
              "verify.yml=6", "--json"])
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
