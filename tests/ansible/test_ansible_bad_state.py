"""The collection's modules on a host state or tool output they cannot read: a state file that is not JSON, a JSON
list or a directory (gpushare_state, host_read, dcgm_diag); `dcgmi diag --json` with `test_categories` a string or
`results` a number (dcgm_diag); `kubectl` answering something other than JSON (kube_node); a containerd
`config.toml` that is not TOML or is a directory (containerd_runtime); a CDI spec path that is a directory
(cdi_spec). Each module runs here as Ansible runs it (`ansible localhost -m ...`, no test hosts), with a fake
`dcgmi`, `kubectl` or `nvidia-ctk` first on PATH, and must fail the task with a message naming the host (or the
node), the file or command and the field, without a MODULE FAILURE traceback, and leave every file as it was: a
state file it could not read is never replaced."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible.test_ansible_line_values import executable, fake_containerd, files_under, module_json
from tests.ansible.test_ansible_modules import rendered_dropin
from tests.ansible.testbed import ROOT

HOST = platform.node()  # the host the module ran on, as `ansible localhost` runs it


def run_module(name: str, args: dict, fakes: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`ansible localhost -m NAME -a ARGS`, with the directory `fakes` first on PATH (the module's own PATH)."""
    bin_dir = Path(sys.executable).parent
    path = f"{bin_dir}:/usr/bin:/bin" if fakes is None else f"{fakes}:{bin_dir}:/usr/bin:/bin"
    return subprocess.run([str(bin_dir / "ansible"), "localhost", "-m", name, "-a", json.dumps(args),
                           *(["--check"] if check else [])], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": path, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                                            "HOME": str(Path.home()), "ANSIBLE_LOCALHOST_WARNING": "False"})


def failed(run: subprocess.CompletedProcess, *named: str) -> str:
    """The failed task's message, after checking it is the module's own (no traceback, no MODULE FAILURE) and
    names each of `named`."""
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "Traceback" not in output and "MODULE FAILURE" not in output, output
    msg = module_json(run)["msg"]
    assert "Module failed" not in msg, msg  # ansible-core 2.19's words for an exception the module did not catch
    for text in named:
        assert text in msg, (text, msg)
    assert "fix:" in msg, msg
    return msg


# ---------------------------------------------------------------- the state file


def bad_state(tmp_path: Path, kind: str) -> tuple[Path, str, str]:
    """A state file of `kind` at tmp_path/state.json, with what the message must name and a fingerprint of it."""
    path = tmp_path / "state.json"
    if kind == "directory":
        path.mkdir()
        (path / "keep").write_text("x")
        return path, "is a directory", "dir"
    text = {"not JSON": '{"state": "success", "cordoned": true,\n', "a JSON list": '["cordoned", true]\n',
            "not UTF-8": '{"state": "succ\xff"}\n'}[kind]
    path.write_bytes(text.encode("latin-1"))
    named = {"not JSON": "not JSON (line 2, column 1", "a JSON list": "the top level is a JSON list",
             "not UTF-8": "not UTF-8: byte 0xff at offset 15"}[kind]
    return path, named, text


def unchanged(path: Path, fingerprint: str) -> bool:
    if fingerprint == "dir":
        return path.is_dir() and [p.name for p in path.iterdir()] == ["keep"]
    return path.read_bytes() == fingerprint.encode("latin-1")


FAKE_DCGMI = """#!/bin/sh
# dcgmi diag -r 1 --json as DCGM 4 prints it (tests/ansible/fixture_packages/bin/dcgmi), from the file `report`.
cat "$(dirname "$0")/report"
"""

PASSING = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
    {"name": "software", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}],
     "test_summary": {"status": "Pass"}}]}]}, "metadata": {"version": "4.4.1"}}


def fake_dcgmi(tmp_path: Path, report: object) -> Path:
    fakes = tmp_path / "bin"
    fakes.mkdir()
    executable(fakes / "dcgmi", FAKE_DCGMI)
    (fakes / "report").write_text(report if isinstance(report, str) else json.dumps(report, indent=4))
    return fakes


@pytest.mark.parametrize("kind", ["not JSON", "a JSON list", "directory", "not UTF-8"])
@pytest.mark.parametrize("module", ["gpushare_state", "host_read", "dcgm_diag"])
def test_a_state_file_gpushare_cannot_read_fails_the_task_and_stays(tmp_path: Path, module: str, kind: str) -> None:
    path, named, fingerprint = bad_state(tmp_path, kind)
    fakes = None
    if module == "gpushare_state":
        args: dict = {"path": str(path), "update": {"cordoned": False}}
    elif module == "host_read":
        args = {"state_path": str(path)}
    else:
        fakes = fake_dcgmi(tmp_path, PASSING)
        args = {"state_path": str(path)}
    msg = failed(run_module(f"gpushare.fleet.{module}", args, fakes), f"host {HOST}", str(path), named,
                 "left as it is")
    assert unchanged(path, fingerprint), msg
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gpushare.")] == []


def test_a_good_state_file_is_still_read_and_updated(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"state": "success"}\n')
    run = run_module("gpushare.fleet.gpushare_state", {"path": str(path), "update": {"cordoned": False}})
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(path.read_text()) == {"state": "success", "cordoned": False}
    read = run_module("gpushare.fleet.host_read", {"state_path": str(path)})
    assert module_json(read)["state"] == {"state": "success", "cordoned": False}
    absent = run_module("gpushare.fleet.host_read", {"state_path": str(tmp_path / "none.json")})
    assert module_json(absent)["state"] == {}


def test_check_mode_refuses_an_unreadable_state_file_too(tmp_path: Path) -> None:
    path, named, fingerprint = bad_state(tmp_path, "a JSON list")
    run = run_module("gpushare.fleet.gpushare_state", {"path": str(path), "update": {"cordoned": False}},
                     check=True)
    failed(run, str(path), named)
    assert unchanged(path, fingerprint)


# ---------------------------------------------------------------- dcgmi's report


def _report(edit) -> dict:
    report = json.loads(json.dumps(PASSING))
    edit(report["DCGM Diagnostic"])
    return report


@pytest.mark.parametrize(("report", "field"), [
    (_report(lambda d: d.update(test_categories="Deployment")),
     "field 'DCGM Diagnostic'.test_categories is a string (\"Deployment\"), not a list of objects"),
    (_report(lambda d: d["test_categories"][0]["tests"][0].update(results=3)),
     "field 'DCGM Diagnostic'.test_categories[0].tests[0].results is a number (3), not a list of objects"),
    (_report(lambda d: d["test_categories"][0].update(tests=["software"])),
     "field 'DCGM Diagnostic'.test_categories[0].tests[0] is a string (\"software\"), not an object"),
    ("dcgmi: <html>502 Bad Gateway</html>", "the output is not JSON"),
])
def test_dcgmi_output_of_another_shape_fails_naming_the_field_and_records_nothing(
        tmp_path: Path, report: object, field: str) -> None:
    fakes = fake_dcgmi(tmp_path, report)
    state = tmp_path / "state.json"
    state.write_text('{"state": "success"}\n')
    msg = failed(run_module("gpushare.fleet.dcgm_diag", {"state_path": str(state)}, fakes), f"host {HOST}",
                 "dcgmi diag -r 1 --json", field, "nothing was recorded")
    assert state.read_text() == '{"state": "success"}\n', msg


def test_dcgmi_report_of_dcgm_4_layout_still_passes(tmp_path: Path) -> None:
    fakes = fake_dcgmi(tmp_path, PASSING)
    run = run_module("gpushare.fleet.dcgm_diag", {"level": 1}, fakes)
    assert run.returncode == 0 and module_json(run)["passed"] is True, run.stdout + run.stderr


# ---------------------------------------------------------------- kubectl's answers


FAKE_KUBECTL = """#!/bin/sh
# kubectl behind a proxy or wrapper that answers `get` with the text in `answer`; every call is logged.
echo "$*" >> "$(dirname "$0")/calls"
case "$*" in
  *" get "*|"get "*) cat "$(dirname "$0")/answer" ;;
esac
"""


@pytest.mark.parametrize(("answer", "named"), [
    ("<html><body>502 Bad Gateway</body></html>\n", "printed something that is not JSON"),
    ('[{"kind": "Node"}]\n', "printed a list at the top level, not an object"),
    ('{"kind": "Node", "metadata": {"labels": ["a=b"]}}\n', "field metadata.labels is a list, not an object"),
])
def test_kubectl_answering_other_than_a_node_object_fails_naming_the_node(
        tmp_path: Path, answer: str, named: str) -> None:
    fakes = tmp_path / "bin"
    fakes.mkdir()
    executable(fakes / "kubectl", FAKE_KUBECTL)
    (fakes / "answer").write_text(answer)
    run = run_module("gpushare.fleet.kube_node", {"node": "gpu-01", "labels": {"gpushare.io/pool": "a"},
                                                  "schedulable": True}, fakes)
    failed(run, "node gpu-01", "kubectl get node gpu-01 -o json", named, "stopped there")
    assert (fakes / "calls").read_text().splitlines() == ["get node gpu-01 -o json"]  # no label, no uncordon


def test_kubectl_pod_list_that_is_not_json_fails_the_wait_naming_the_node(tmp_path: Path) -> None:
    fakes = tmp_path / "bin"
    fakes.mkdir()
    executable(fakes / "kubectl", FAKE_KUBECTL.replace(
        '*" get "*|"get "*) cat "$(dirname "$0")/answer" ;;',
        '"get node"*) echo \'{"kind": "Node", "spec": {"unschedulable": true}}\' ;;\n'
        '  "get pods"*) echo "error: You must be logged in to the server" ;;'))
    run = run_module("gpushare.fleet.kube_node", {"node": "gpu-01", "drain": True, "drain_mode": "wait"}, fakes)
    failed(run, "node gpu-01", "get pods --all-namespaces --field-selector spec.nodeName=gpu-01 -o json",
           "not JSON")


# ---------------------------------------------------------------- containerd's config.toml


def test_containerd_config_that_is_not_toml_fails_naming_host_file_and_line(tmp_path: Path) -> None:
    containerd = fake_containerd(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"\nsandbox_image = "pause"\n')
    dropin = etc / "conf.d" / "99-gpushare-nvidia.toml"
    args = {"content": rendered_dropin("2.1"), "dropin_path": str(dropin), "config_path": str(config),
            "containerd": str(containerd)}
    failed(run_module("gpushare.fleet.containerd_runtime", args), f"host {HOST}", f"config_path: {config}",
           "is not TOML", "line 2", "nothing was written")
    assert files_under(etc) == [config]
    assert config.read_text().startswith("version = 2\n[plugins")


@pytest.mark.parametrize("which", ["config_path", "dropin_path"])
def test_containerd_paths_that_are_directories_fail_naming_the_option(tmp_path: Path, which: str) -> None:
    containerd = fake_containerd(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    config.write_text("version = 2\n")
    dropin = etc / "conf.d" / "99-gpushare-nvidia.toml"
    ({"config_path": config, "dropin_path": dropin}[which]).unlink(missing_ok=True)
    ({"config_path": config, "dropin_path": dropin}[which]).mkdir(parents=True)
    args = {"content": rendered_dropin("2.1"), "dropin_path": str(dropin), "config_path": str(config),
            "containerd": str(containerd)}
    failed(run_module("gpushare.fleet.containerd_runtime", args), f"host {HOST}", f"option {which}",
           "is a directory", "nothing was written")
    assert files_under(etc) == ([config] if which == "dropin_path" else [])


def test_containerd_content_that_is_not_toml_names_the_host(tmp_path: Path) -> None:
    containerd = fake_containerd(tmp_path)
    args = {"content": "version = 2\n[plugins\n", "dropin_path": str(tmp_path / "conf.d" / "nvidia.toml"),
            "config_path": str(tmp_path / "config.toml"), "containerd": str(containerd)}
    failed(run_module("gpushare.fleet.containerd_runtime", args), f"host {HOST}", "option content is not TOML",
           "line 2")
    assert files_under(tmp_path) == [containerd]


# ---------------------------------------------------------------- the CDI spec's path


FAKE_CTK = """#!/bin/sh
echo ran >> "$(dirname "$0")/calls"
printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices:\\n- name: all\\n'
"""


def test_a_cdi_spec_path_that_is_a_directory_fails_before_nvidia_ctk_runs(tmp_path: Path) -> None:
    fakes = tmp_path / "bin"
    fakes.mkdir()
    executable(fakes / "nvidia-ctk", FAKE_CTK)
    spec = tmp_path / "cdi" / "nvidia.yaml"
    spec.mkdir(parents=True)
    failed(run_module("gpushare.fleet.cdi_spec", {"path": str(spec)}, fakes), f"host {HOST}",
           f"option path {spec} is a directory", "nothing was written")
    assert spec.is_dir() and list(spec.iterdir()) == []
    assert not (fakes / "calls").exists()
    beside = tmp_path / "file"
    beside.write_text("x")
    failed(run_module("gpushare.fleet.cdi_spec", {"path": str(beside / "nvidia.yaml")}, fakes),
           f"lies under {beside}, which is a file")
    good = run_module("gpushare.fleet.cdi_spec", {"path": str(tmp_path / "cdi" / "ok.yaml")}, fakes)
    assert good.returncode == 0 and module_json(good)["changed"] is True, good.stdout + good.stderr
