"""`gpushare rollout --awx-url`'s refusals, against the AWX stand-in (no test hosts: nothing is launched). The
rollout through it for real is in test_ansible_rollout.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.ops.rollout.awx import AwxBackend, parse_templates
from tests.ansible.awx_standin import AwxStandIn, JobTemplate
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
