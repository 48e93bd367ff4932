"""Every command of docs/cli.md's table exits with the codes that table documents: for each command, the real CLI
(gpushare.cli.main, the exit-code boundary `gpushare` runs) is given one input per documented code that can be
produced without a GPU, a cluster or the network, and the code is asserted. The documented codes are read from
docs/cli.md, so a page and a command that disagree fail here; a documented code with no input here must say why.

Prometheus stands in as a stub on 127.0.0.1 that knows no series; NVML as the fake of tests/unit/cli/test_gpu.py."""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, WORKSPACE
from tests.prometheus.server import free_port

DOC = ROOT / "docs" / "cli.md"
CLUSTERS = ROOT / "tests" / "data" / "brownfield"


def documented_codes(text: str | None = None) -> dict[str, set[int]]:
    """docs/cli.md's table: command (its words, and for a second row of the same command the first option the first
    row lacks, e.g. `capacity --backfill-rules`) -> the exit codes of its last column."""
    out: dict[str, set[int]] = {}
    options: dict[str, set[str]] = {}
    for line in (text if text is not None else DOC.read_text()).splitlines():
        if not line.startswith("| `gpushare "):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        command, codes = cells[0].strip("`"), cells[-1]
        words = []
        for token in command.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*", token):
                break
            words.append(token)
        key = " ".join(words)
        flags = re.findall(r"--[a-z][a-z-]*", command)
        if key in out:
            key += " " + next(f for f in flags if f not in options[key])
        options.setdefault(key, set(flags))
        out[key] = {int(c) for c in re.findall(r"(?:^|,)\s*(\d+)\b", codes)}
    return out


def test_the_table_is_read_as_written() -> None:
    codes = documented_codes()
    assert codes["check"] == {0, 1, 2} and codes["discover"] == {0, 3} and codes["rollout"] == {0, 1, 2, 3}
    assert codes["mig validate"] == {0, 1, 2} and codes["gpus"] == {0} and codes["init"] == {0, 2}
    assert codes["capacity --backfill-rules"] == {0, 2} and codes["capacity"] == {0, 1, 2}
    assert len(codes) == len([line for line in DOC.read_text().splitlines() if line.startswith("| `gpushare ")])


# ---------------------------------------------------------------- the inputs


class _NoSeries(BaseHTTPRequestHandler):
    """The Prometheus HTTP API of a server that holds no series: every query answers an empty result."""

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        kind = "matrix" if path.endswith("/query_range") else "vector"
        data: Any = {"resultType": kind, "result": []} if path.endswith(("/query", "/query_range")) else []
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class World:
    root: Path
    workspace: Path  # made by `gpushare init`, with the files the cases below name under cases/
    prometheus: str  # the stub
    unreachable: str = field(default_factory=lambda: f"http://127.0.0.1:{free_port()}")


def run(args: list[str]) -> int:
    """gpushare as its console script runs it: the exit code main() ends with."""
    from gpushare.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def edited(source: Path, target: Path, *pairs: tuple[str, str]) -> Path:
    text = source.read_text()
    for old, new in pairs:
        assert text.count(old) == 1, (source, old)
        text = text.replace(old, new)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


DEMAND = """apiVersion: gpushare.io/v1
kind: Demand
name: tiny
gpus:
  - {model: NVIDIA L4, count: 2}
workloads:
  - {name: web, tenant: search, kind: online, memory_gib: 6, compute: 0.2, replicas: 2}
"""
ODD_PROFILE = """apiVersion: gpushare.io/v1
name: odd
kind: mig
description: a layout for a GPU model the catalog does not know
mig:
  layouts:
    NVIDIA Nonexistent 99GB: "1g.10gb=7"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("exit-codes")
    workspace = root / "ws"
    assert run(["init", str(workspace)]) == 0
    dev = workspace / "environments" / "dev.yaml"
    cases = workspace / "cases"
    edited(dev, cases / "broken" / "environments" / "dev.yaml", ("profile: mig-balanced", "profile: no-such-profile"))
    # An untrusted tenant guaranteed a time-sliced resource: a mandatory violation.
    edited(dev, cases / "violating" / "environments" / "dev.yaml",
           ("      nvidia.com/mig-1g.10gb: 8\n", "      nvidia.com/gpu.shared: 4\n"))
    edited(dev, cases / "no-context" / "environments" / "dev.yaml", ("    kubeconfig_context: dev-metal-admin\n", ""))
    (cases / "demand.yaml").write_text(DEMAND)
    (cases / "demand-too-big.yaml").write_text(DEMAND.replace("memory_gib: 6", "memory_gib: 900"))
    (cases / "prices.yaml").write_text("prices: [\n")
    (cases / "dumps-not-yaml").mkdir()
    (cases / "dumps-not-yaml" / "nodes.yaml").write_text("items: [\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoSeries)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield World(root, workspace, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Case:
    command: str
    code: int
    argv: Callable[[World, Path], list[str]]  # (world, this case's own scratch folder) -> arguments
    label: str = ""
    workspace: str = "init"  # whose GPUSHARE_ROOT: "init" (World.workspace), "frozen" (tests/fixtures), "none"
    setup: Callable[[World, Path, pytest.MonkeyPatch], None] | None = None


def _imported(name: str, env: str) -> Callable[[World, Path, pytest.MonkeyPatch], None]:
    """Import a dump fixture as `env` into the world's workspace once (what `drift` compares with)."""
    def setup(w: World, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if not (w.workspace / "environments" / f"{env}.yaml").exists():
            assert run(["import", "--from", str(CLUSTERS / name), "--env", env, "--out", str(w.workspace),
                        "--json"]) == 0
    return setup


def _fresh(extra: dict[str, str] | None = None, links: dict[str, str] | None = None
           ) -> Callable[[World, Path, pytest.MonkeyPatch], None]:
    def setup(w: World, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from gpushare.cli.init import write_workspace

        write_workspace(scratch / "ws")
        for rel, text in (extra or {}).items():
            (scratch / "ws" / rel).write_text(text)
        for rel, target in (links or {}).items():
            (scratch / "ws" / rel).symlink_to(target)
    return setup


def _nvml(fake: bool) -> Callable[[World, Path, pytest.MonkeyPatch], None]:
    def setup(w: World, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from tests.unit.cli.test_gpu import fake_nvml

        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml() if fake else None)  # None: `import pynvml` fails
    return setup


def _without_pulumi(w: World, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with git (the workspace's revisions) and no Pulumi CLI: the rollout stops at its first Pulumi step."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    monkeypatch.setenv("PATH", str(bin_dir))


def _used_dir(w: World, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (scratch / "used").mkdir()
    (scratch / "used" / "notes.txt").write_text("mine")


GPU = "NVIDIA A100-SXM4-80GB"
BROKEN = "cases/broken/environments/dev.yaml"
VIOLATING = "cases/violating/environments/dev.yaml"
NO_CONTEXT = "cases/no-context/environments/dev.yaml"

CASES: list[Case] = [
    Case("validate", 0, lambda w, s: ["validate", "--env", "dev"]),
    Case("validate", 1, lambda w, s: ["validate", "--env", BROKEN], "unknown profile"),
    Case("validate", 2, lambda w, s: ["validate", "--env", "nosuch"], "unknown environment"),
    Case("plan", 0, lambda w, s: ["plan", "--env", "dev", "--json"]),
    Case("plan", 1, lambda w, s: ["plan", "--env", BROKEN], "unknown profile"),
    Case("plan", 2, lambda w, s: ["plan", "--env", "nosuch"], "unknown environment"),
    Case("render", 0, lambda w, s: ["render", "--env", "dev", "--out", str(s / "out")]),
    Case("render", 1, lambda w, s: ["render", "--env", BROKEN, "--out", str(s / "out")], "unknown profile"),
    Case("render", 2, lambda w, s: ["render", "--env", "dev", "--out", str(w.workspace / "gpushare.yaml")],
         "output is a file"),
    Case("mig validate", 0, lambda w, s: ["mig", "validate", "--gpu", GPU, "--layout", "1g.10gb=7"]),
    Case("mig validate", 1, lambda w, s: ["mig", "validate", "--gpu", GPU, "--layout", "1g.10gb=8"], "too many"),
    Case("mig validate", 2, lambda w, s: ["mig", "validate", "--gpu", "No Such GPU", "--layout", "1g.10gb=1"],
         "unknown GPU"),
    Case("mig profiles", 0, lambda w, s: ["mig", "profiles", "--gpu", GPU]),
    Case("mig profiles", 2, lambda w, s: ["mig", "profiles", "--gpu", "No Such GPU"], "unknown GPU"),
    Case("gpus", 0, lambda w, s: ["gpus", "--json"]),
    Case("discover", 0, lambda w, s: ["discover", "--json"], "fake NVML", setup=_nvml(fake=True)),
    Case("discover", 3, lambda w, s: ["discover"], "no NVML", setup=_nvml(fake=False)),
    Case("check", 0, lambda w, s: ["check", "--env", "dev"]),
    Case("check", 1, lambda w, s: ["check", "--env", VIOLATING, "--no-plan"], "untrusted tenant on a shared pool"),
    Case("check", 2, lambda w, s: ["check", "--env", "nosuch"], "unknown environment"),
    Case("check", 2, lambda w, s: ["check", "--env", NO_CONTEXT], "no kubeconfig context"),
    Case("check", 2, lambda w, s: ["check", "--env", "dev", "--base", "no-such-branch"], "unknown base"),
    Case("capacity", 1, lambda w, s: ["capacity", "--env", "dev", "--prometheus", w.prometheus, "--patch",
                                      str(s / "p.patch")], "no data"),
    Case("capacity", 2, lambda w, s: ["capacity", "--env", "dev", "--prometheus", w.unreachable], "unreachable"),
    Case("capacity --backfill-rules", 2,
         lambda w, s: ["capacity", "--env", "dev", "--prometheus", w.unreachable, "--window", "30d",
                       "--backfill-rules", str(s / "blocks")], "unreachable"),
    Case("showback", 1, lambda w, s: ["showback", "--env", "dev", "--prometheus", w.prometheus, "--prices",
                                      "cases/prices.yaml"], "bad prices file"),
    Case("showback", 1, lambda w, s: ["showback", "--env", "dev", "--prometheus", w.prometheus], "no data"),
    Case("showback", 2, lambda w, s: ["showback", "--env", "dev", "--prometheus", w.unreachable], "unreachable"),
    Case("promote", 1, lambda w, s: ["promote", "--from", "pilot", "--to", "prod", "--no-plan", "--patch",
                                     str(s / "p.patch")], "no evidence", workspace="frozen"),
    Case("promote", 2, lambda w, s: ["promote", "--from", "dev", "--to", "prod", "--no-plan"], "not promoted from",
         workspace="frozen"),
    Case("pack", 0, lambda w, s: ["pack", "--demand", "cases/demand.yaml", "--time-limit", "10", "--json"]),
    Case("pack", 1, lambda w, s: ["pack", "--demand", "cases/demand-too-big.yaml", "--time-limit", "10"],
         "cannot be served"),
    Case("pack", 2, lambda w, s: ["pack", "--demand", "cases/no-such-demand.yaml"], "unreadable file"),
    Case("preview", 0, lambda w, s: ["preview", "--env", "dev", "--json"]),
    Case("preview", 1, lambda w, s: ["preview", "--env", BROKEN], "unknown profile"),
    Case("preview", 2, lambda w, s: ["preview", "--env", "nosuch"], "unknown stack"),
    Case("rollout", 0, lambda w, s: ["rollout", "--env", "dev", "--dry-run", "--journal", str(s / "j.jsonl")]),
    Case("rollout", 1, lambda w, s: ["rollout", "--env", VIOLATING, "--dry-run", "--journal", str(s / "j.jsonl")],
         "refused by check"),
    Case("rollout", 2, lambda w, s: ["rollout", "--env", "dev", "--dry-run", "--batches", "0%"], "bad batches"),
    Case("rollout", 3, lambda w, s: ["rollout", "--env", "dev", "--journal", str(s / "j.jsonl")],
         "manual Pulumi step", setup=_without_pulumi),
    Case("import", 0, lambda w, s: ["import", "--from", str(CLUSTERS / "quotas-kueue"), "--env", "brown", "--out",
                                    str(s / "ws")], setup=_fresh()),
    Case("import", 1, lambda w, s: ["import", "--from", str(CLUSTERS / "quotas-kueue"), "--env", "brown", "--out",
                                    str(s / "ws")], "written environment does not resolve",
         setup=_fresh({"profiles/odd.yaml": ODD_PROFILE})),
    Case("import", 2, lambda w, s: ["import", "--from", "/no/such/dir", "--env", "brown"], "mistyped dump path"),
    Case("import", 2, lambda w, s: ["import", "--from", "cases/dumps-not-yaml", "--env", "brown"], "dump not YAML"),
    Case("drift", 0, lambda w, s: ["drift", "--env", "kueue", "--from", str(CLUSTERS / "quotas-kueue")],
         setup=_imported("quotas-kueue", "kueue")),
    Case("drift", 1, lambda w, s: ["drift", "--env", "nte", "--from", str(CLUSTERS / "not-taken-effect")],
         setup=_imported("not-taken-effect", "nte")),
    Case("drift", 2, lambda w, s: ["drift", "--env", "dev", "--from", "/no/such/dir"], "mistyped dump path"),
    Case("drift", 2, lambda w, s: ["drift", "--env", "dev", "--from", "cases/dumps-not-yaml"], "dump not YAML"),
    Case("diff", 2, lambda w, s: ["diff", "--env", "dev", "--kubeconfig", str(s / "no-such-kubeconfig")],
         "kubeconfig not found"),
    Case("diff", 2, lambda w, s: ["diff", "--env", "dev", "--kubeconfig", str(s / "used" / "notes.txt")],
         "a kubeconfig that is not one", setup=_used_dir),
    Case("drift", 2, lambda w, s: ["drift", "--env", "dev", "--kubeconfig", str(s / "used" / "notes.txt")],
         "a kubeconfig that is not one", setup=_used_dir),
    Case("validate", 2, lambda w, s: ["validate", "--env", str(s / "ws" / "environments" / "dev.yaml")],
         "a profile that is a link to itself", setup=_fresh(links={"profiles/loop.yaml": "loop.yaml"})),
    Case("schema", 0, lambda w, s: ["schema", "--out", str(s / "schema")]),
    Case("schema", 2, lambda w, s: ["schema", "--out", str(s / "used" / "notes.txt")], "an --out that is a file",
         setup=_used_dir),
    Case("init", 0, lambda w, s: ["init", str(s / "new")]),
    Case("init", 2, lambda w, s: ["init", str(s / "used")], "not empty", setup=_used_dir),
    Case("demo-metrics", 2, lambda w, s: ["demo-metrics", "--data-dir", str(s / "used")], "a used --data-dir",
         setup=_used_dir),
    Case("ansible-env", 0, lambda w, s: ["ansible-env"]),
    Case("ansible-env", 2, lambda w, s: ["ansible-env"], "outside a workspace", workspace="none"),
]

# Documented codes no input here produces, and where they are produced instead.
ELSEWHERE: dict[tuple[str, int], str] = {
    ("capacity", 0): "needs DCGM history in Prometheus: tests/prometheus/test_capacity.py over a real server (slow)",
    ("capacity --backfill-rules", 0): "needs history to backfill and promtool: tests/prometheus/test_backfill.py",
    ("showback", 0): "needs DCGM history in Prometheus: tests/showback/test_showback_prometheus.py",
    ("promote", 0): "needs the source's run time in Prometheus: tests/prometheus/test_promote.py",
    ("demo-metrics", 0): "serves until Ctrl-C: tests/prometheus/test_demo_metrics.py",
    ("diff", 0): "needs a running API server: tests/cluster/test_adoption_running.py",
    ("diff", 1): "needs running work to break: tests/cluster/test_adoption_running.py (--fail-on-impact)",
    ("demo-metrics", 1): "needs the Prometheus it started to die under it: not produced by any test yet",
}


def test_every_documented_code_has_an_input_or_says_where_it_is_produced() -> None:
    documented = documented_codes()
    covered = {(c.command, c.code) for c in CASES} | set(ELSEWHERE)
    wanted = {(command, code) for command, codes in documented.items() for code in codes}
    assert sorted(wanted - covered) == [], "documented codes with no input here: add a case or an ELSEWHERE entry"
    assert sorted(covered - wanted) == [], "inputs for codes docs/cli.md does not document for that command"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command}-{c.code}" + (f"-{c.label}" if c.label else ""))
def test_the_command_exits_as_documented(case: Case, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert case.code in documented_codes()[case.command], f"docs/cli.md documents no exit {case.code} for it"
    workspace = {"init": world.workspace, "frozen": WORKSPACE, "none": None}[case.workspace]
    if workspace is None:
        monkeypatch.delenv("GPUSHARE_ROOT", raising=False)
        monkeypatch.chdir(tmp_path)
    else:
        monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
        monkeypatch.chdir(workspace)
    monkeypatch.setenv("COLUMNS", "80")
    if case.setup is not None:
        case.setup(world, tmp_path, monkeypatch)
    code = run(case.argv(world, tmp_path))
    out, err = capsys.readouterr()
    assert code == case.code, f"exit {code}, documented {case.code} ({case.label}):\n{out[-3000:]}\n{err[-3000:]}"
    assert "Traceback" not in out + err
