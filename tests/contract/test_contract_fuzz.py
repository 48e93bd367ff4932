"""The bad-input contract under generated input: mutated YAML documents (environments, profiles, waivers, demand,
guardrails) and generated command lines, each run by a real gpushare process under an address-space limit.
Every run must end with a documented exit code, no traceback, a fix where it fails, and no file changed outside
its output path. Examples are bounded and derandomized, so CI is repeatable."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.contract.harness import ROOT, Worker, assert_contract, make_workspace, seed, snapshot, write_input

pytestmark = pytest.mark.slow
CLUSTERS = ROOT / "tests" / "data" / "brownfield"  # kubectl dumps of running clusters (read-only)

# YAML text that surprises: YAML 1.1 booleans and dates, sexagesimal, octal, huge and odd numbers, templates
# and shell, empty and nested values, anchors, long text, control characters.
NASTY = [
    "no", "yes", "on", "off", "y", "2026-02-30", "2027-13-45", "1:30", "010", "0x1F", "1e309", "-1", "0", "true",
    "'4'", "4.5", ".nan", "-.inf", "null", "~", "[]", "{}", "[1, [2, [3]]]", "9" * 5000, "99999999999999999999",
    "'{{ lookup(\"pipe\", \"id\") }}'", "$(id)", "`id`", "\"\\0\"", "\"\\u00e9t\\u00e9\"", "x" * 3000,
    "!!binary aGVsbG8=", "&a [*a, *a]", "!!python/object:os.system ['id']", "{a: 1, a: 2}", "'  '", "''",
]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("contract-ws"))


@pytest.fixture(scope="module")
def worker(workspace: Path) -> Iterator[Worker]:
    w = Worker(workspace)
    yield w
    w.close()


def _paths(node: Any, base: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [base] if base else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*base, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*base, i))
    return out


_PLACEHOLDER = "GPUSHARE_NASTY_PLACEHOLDER"


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        doc = doc[part]
    del doc[path[-1]]


Mutation = tuple[str, int, int, float]
MUTATIONS = st.tuples(st.sampled_from(["replace", "replace", "replace", "delete", "unknown-key", "truncate",
                                       "bad-bytes", "duplicate-line"]),
                      st.integers(0, 10_000), st.integers(0, len(NASTY) - 1), st.floats(0, 1))


def mutate(text: bytes, mutations: list[Mutation]) -> bytes:
    """Apply data-level mutations (placeholders turned into raw YAML text after dumping) and text-level ones."""
    doc = yaml.safe_load(text)
    raw: list[str] = []
    text_ops: list[Mutation] = []
    for m in mutations:
        op, where, nasty, _ = m
        paths = _paths(doc)
        if op in ("truncate", "bad-bytes", "duplicate-line") or not paths:
            text_ops.append(m)
            continue
        path = paths[where % len(paths)]
        if op == "replace":
            _set(doc, path, f"{_PLACEHOLDER}{len(raw)}")
            raw.append(NASTY[nasty])
        elif op == "delete":
            _delete(doc, path)
        else:
            parent = doc
            for part in path[:-1]:
                parent = parent[part]
            target = parent if isinstance(parent, dict) else doc
            target[f"{path[-1]}x"] = 1
    body = yaml.safe_dump(doc, sort_keys=False, width=10_000)
    for i, value in enumerate(raw):
        body = body.replace(f"'{_PLACEHOLDER}{i}'", value).replace(f"{_PLACEHOLDER}{i}", value)
    data = body.encode()
    for op, where, _, at in text_ops:
        cut = int(len(data) * at)
        if op == "truncate":
            data = data[:cut]
        elif op == "bad-bytes":
            data = data[:cut] + [b"\xff\xfe", b"\x00", b"\t", b"\xc3("][where % 4] + data[cut:]
        else:
            lines = data.split(b"\n")
            i = where % len(lines)
            data = b"\n".join(lines[: i + 1] + lines[i:])
    return data


def _run(worker: Worker, args: list[str]) -> None:
    before = snapshot(worker.workspace)
    result = worker.run(args)
    assert_contract(result, args, before, snapshot(worker.workspace))


@SETTINGS
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=3),
       command=st.sampled_from(["validate", "plan", "render", "check"]), json_out=st.booleans())
def test_mutated_environment(worker: Worker, mutations: list[Mutation], command: str, json_out: bool) -> None:
    env = write_input(worker.workspace, "dev.yaml", mutate(seed("dev.yaml"), mutations))
    args = [command, "--env", env] + {"render": ["--out", "out/render"], "check": ["--no-plan", "--today",
                                                                                 "2026-12-01"]}.get(command, [])
    _run(worker, args + (["--json"] if json_out else []))


@SETTINGS
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_mutated_profile(worker: Worker, mutations: list[Mutation]) -> None:
    write_input(worker.workspace, "profiles/mig-balanced.yaml", mutate(seed("profile.yaml"), mutations))
    _run(worker, ["validate", "--env", "environments/dev.yaml", "--profiles", "inputs/profiles"])


@SETTINGS
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_mutated_waivers(worker: Worker, mutations: list[Mutation]) -> None:
    waivers = write_input(worker.workspace, "waivers.yaml", mutate(seed("waivers.yaml"), mutations))
    _run(worker, ["check", "--env", "dev", "--no-plan", "--today", "2026-12-01", "--waivers", waivers, "--json"])


@settings(SETTINGS, max_examples=15)
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_mutated_demand(worker: Worker, mutations: list[Mutation]) -> None:
    demand = write_input(worker.workspace, "demand.yaml", mutate(seed("demand.yaml"), mutations))
    _run(worker, ["pack", "--demand", demand, "--time-limit", "2", "--json"])


@settings(SETTINGS, max_examples=40)
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=2),
       command=st.sampled_from(["validate", "plan", "check"]))
def test_mutated_guardrails(worker: Worker, mutations: list[Mutation], command: str) -> None:
    path = worker.workspace / "policies" / "guardrails.yaml"
    original = path.read_bytes()
    path.write_bytes(mutate(original, mutations))
    try:
        _run(worker, [command, "--env", "dev"] + (["--no-plan"] if command == "check" else []))
    finally:
        path.write_bytes(original)


LAYOUT_ITEM = st.tuples(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb", "1g.10gb+me", "", "x", "1g.10gb@0",
                                         "4g.40gb", " 2g.20gb "]),
                        st.one_of(st.none(), st.integers(-3, 10), st.integers(10**5, 10**30),
                                  st.text(alphabet="0123456789=@,-x ", max_size=6)))
ENV_ARG = st.sampled_from(["dev", "pilot", "prod", "staging", "environments", "inputs/dir.yaml",
                           "inputs/fifo.yaml", "/dev/null", "inputs/missing.yaml", "Pulumi.yaml", ""])
OUT_ARG = st.sampled_from(["out/r", "out/r/deeper", "environments", ".", "profiles/x", "Pulumi.yaml", "policies",
                           "out/../environments/x", "/proc/gpushare"])
PROM_ARG = st.sampled_from(["not a url", "ftp://127.0.0.1", "http://", "http://[::1", "http://127.0.0.1:99999",
                            "http://127.0.0.1:9", "", "127.0.0.1:9090"])


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    kind = draw(st.sampled_from(["mig", "render", "validate", "capacity", "check", "promote", "pack", "plan",
                                 "preview", "rollout", "discover", "schema", "mig-profiles", "import", "drift",
                                 "showback"]))
    if kind == "import":
        source = draw(st.sampled_from(["inputs/dir.yaml", "inputs/missing", "environments", "inputs/fifo.yaml",
                                       "/dev/null", str(CLUSTERS / "default-operator")]))
        return ["import", "--from", source, "--env", draw(st.sampled_from(["adopted", "dev", "Bad_Name", ""])),
                "--out", draw(st.sampled_from(["out/ws", "environments", "inputs/dir.yaml", "."]))]
    if kind == "drift":
        source = draw(st.sampled_from(["inputs/dir.yaml", "inputs/missing", "environments",
                                       str(CLUSTERS / "timeslicing-mig")]))
        return ["drift", "--env", draw(ENV_ARG), "--from", source,
                "--stuck-after", draw(st.sampled_from(["30", "-1", "x", "1e400"]))]
    if kind == "showback":
        return ["showback", "--env", draw(ENV_ARG), "--prometheus", draw(PROM_ARG),
                "--window", draw(st.sampled_from(["30d", "0d", "x", "99999999999999999999d"]))]
    if kind == "preview":
        return ["preview", "--env", draw(st.sampled_from(["staging", "inputs/dir.yaml", "dev", "inputs/missing.yaml"])),
                "--out", draw(OUT_ARG)]
    if kind == "rollout":
        batches = draw(st.sampled_from(["1,50%,100%", "0", "150%", "x", "1,1", "", "99999999999999999999", "-1"]))
        return ["rollout", "--env", draw(ENV_ARG), "--dry-run", "--batches", batches, "--journal",
                draw(st.sampled_from(["out/journal.jsonl", "inputs/dir.yaml", "environments/dev.yaml"]))]
    if kind == "discover":
        return ["discover"]
    if kind == "schema":
        return ["schema", "--out", draw(OUT_ARG)]
    if kind == "mig-profiles":
        return ["mig", "profiles", "--gpu", draw(st.sampled_from(["h100", "", "x" * 300, "NVIDIA L4", "0x0"]))]
    if kind == "mig":
        items = draw(st.lists(LAYOUT_ITEM, min_size=1, max_size=4))
        layout = ",".join(p if c is None else f"{p}={c}" for p, c in items)
        gpu = draw(st.sampled_from(["NVIDIA A100-SXM4-80GB", "h100", "NVIDIA L4", "Quantum 9000", "", "0x20B210DE"]))
        return ["mig", "validate", "--gpu", gpu, "--layout", layout]
    if kind == "render":
        return ["render", "--env", draw(ENV_ARG), "--out", draw(OUT_ARG)]
    if kind in ("validate", "plan"):
        return [kind, "--env", draw(ENV_ARG)]
    if kind == "capacity":
        window = draw(st.sampled_from(["7d", "0d", "x", "99999999999999999999d", "1h"]))
        backfill = draw(st.sampled_from([[], ["--backfill-rules", draw(OUT_ARG)], ["--data-dir", "inputs/dir.yaml"],
                                         ["--backfill-rules", "out/b", "--data-dir", draw(OUT_ARG)]]))
        return ["capacity", "--env", draw(ENV_ARG), "--prometheus", draw(PROM_ARG), "--window", window, *backfill]
    if kind == "check":
        today = draw(st.sampled_from(["2026-12-01", "2026-02-30", "tomorrow", ""]))
        waivers = draw(st.sampled_from(["inputs/missing.yaml", "inputs/dir.yaml", "inputs/fifo.yaml", "/dev/null"]))
        return ["check", "--env", draw(ENV_ARG), "--no-plan", "--today", today, "--waivers", waivers]
    if kind == "promote":
        a, b = draw(st.sampled_from(["pilot", "prod", "dev", "nowhere"])), draw(st.sampled_from(["prod", "pilot"]))
        extra = ["--prometheus", draw(PROM_ARG)] if draw(st.booleans()) else []
        return ["promote", "--from", a, "--to", b, "--no-plan", *extra]
    if kind == "pack":
        gpus = draw(st.sampled_from(["NVIDIA L4=8", "NVIDIA L4=99999999999", "L4=2,L4=3", "=", "", "x=y"]))
        return ["pack", "--demand", draw(st.sampled_from(["inputs/missing.yaml", "inputs/dir.yaml",
                                                           "examples/demand/inference.yaml"])),
                "--gpus", gpus, "--time-limit", "2", "--env-out", draw(OUT_ARG)]
    return ["plan", "--env", draw(ENV_ARG)]


@settings(SETTINGS, max_examples=200)
@given(args=command_lines(), json_out=st.booleans())
def test_generated_command_lines(worker: Worker, args: list[str], json_out: bool) -> None:
    json_ok = args[0] not in ("mig", "schema", "discover")
    _run(worker, args + (["--json"] if json_out and json_ok else []))


def test_mutation_keeps_the_seed_when_nothing_is_replaced() -> None:
    """The mutator itself: a replace puts the raw YAML text in place, so `no` reaches gpushare unquoted."""
    data = mutate(seed("dev.yaml"), [("replace", 0, NASTY.index("no"), 0.0)])
    assert data.startswith(b"name: no\n")
    original = yaml.safe_load(seed("dev.yaml"))
    assert yaml.safe_load(mutate(seed("dev.yaml"), [])) == copy.deepcopy(original)


def test_worker_runs_under_the_limit(worker: Worker) -> None:
    """The cap is real: above what the imports reserve, below what the old layout bug took."""
    ready = worker.ready
    assert ready["vmsize_after_imports"] < ready["limit"] < 2 * 1024**3
    result = worker.run(["mig", "validate", "--gpu", "NVIDIA A100-SXM4-80GB", "--layout", "1g.10gb=100000000"])
    assert result.code == 2 and "more than any GPU holds" in result.text
