"""Each kind of bad input, the command, and what gpushare answers: run by tests/contract/test_catalogue.py, which
also writes docs/bad-input.md from the answers, so the page cannot drift from what users see."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.errors import printable
from tests.contract.harness import Result, Worker, seed

DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-input.md"


def _dev(old: bytes, new: bytes) -> bytes:
    text = seed("dev.yaml")
    assert old in text, old
    return text.replace(old, new, 1)


@dataclass
class Case:
    kind: str
    input: str
    args: list[str]
    code: int
    contains: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # symbolic links under inputs/: name -> where they point


def _pilot_over_quota(root: Path) -> bytes:
    text = (root / "environments" / "pilot.yaml").read_bytes()
    start = text.index(b"quota:")
    end = text.index(b"\n", text.index(b": ", start + 7))
    key = text[start:end].split(b"\n")[1].split(b":")[0]
    return text[:start] + b"quota:\n" + key + b": 400" + text[end:]


_BOMB = b"x-laughs:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + b"".join(
    f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n".encode() for i in range(1, 10))


def _node_dump(count: bytes, taints: bytes = b"taints: []", managed: bytes = b"managedFields: []") -> bytes:
    """One GPU node as `kubectl get nodes -o yaml` writes it, with the given fields."""
    return (b"apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n"
            b"    name: gpu-01\n    " + managed + b"\n    labels:\n      nvidia.com/gpu.present: \"true\"\n"
            b"      nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB\n      " + count + b"\n  spec:\n    " + taints +
            b"\n  status:\n    addresses: [{type: InternalIP, address: 10.0.1.11}]\n")


CASES = [
    Case("file", "`--env` names a directory", ["validate", "--env", "inputs/dir.yaml"], 2, ["is a directory"]),
    Case("file", "`--env` names a FIFO", ["validate", "--env", "inputs/fifo.yaml"], 2, ["FIFO"]),
    Case("file", "`--env` names a device", ["plan", "--env", "/dev/null"], 2, ["not a regular file"]),
    Case("file", "`--env` names a missing file", ["validate", "--env", "inputs/missing.yaml"], 2, ["not found"]),
    Case("file", "`--env` names no known environment", ["validate", "--env", "staging"], 2,
         ["no environment named 'staging'"]),
    Case("file", "bytes that are not UTF-8", ["validate", "--env", "inputs/dev.yaml"], 2, ["not UTF-8", "offset"],
         {"dev.yaml": _dev(b"Developer sandbox", b"Developer \xff sandbox")}),
    Case("file", "a file above 4 MiB", ["validate", "--env", "inputs/dev.yaml"], 2, ["above the limit"],
         {"dev.yaml": seed("dev.yaml") + b"#" * (4 * 1024 * 1024)}),
    Case("yaml", "not YAML at all", ["validate", "--env", "inputs/dev.yaml"], 1, ["not valid YAML"],
         {"dev.yaml": b"name: dev\n  pools: [\n"}),
    Case("yaml", "a key twice", ["validate", "--env", "inputs/dev.yaml"], 1, ["appears twice"],
         {"dev.yaml": _dev(b"description:", b"description: first\ndescription:")}),
    Case("yaml", "an impossible date is text, not an error", ["validate", "--env", "inputs/dev.yaml"], 0, ["ok"],
         {"dev.yaml": _dev(b"description: Developer sandbox for trying sharing profiles before they go to the "
                           b"pilot.", b"description: 2026-02-30")}),
    Case("yaml", "a 5,000-digit number", ["validate", "--env", "inputs/dev.yaml"], 1, ["longer than 18 digits"],
         {"dev.yaml": _dev(b"gpu_count: 4", b"gpu_count: " + b"9" * 5000)}),
    Case("yaml", "a merge key (`<<: *anchor`) that would make a tenant trusted", ["validate", "--env",
                                                                                  "inputs/dev.yaml"], 1,
         ["merge key"], {"dev.yaml": _dev(b"  - name: research\n", b"  - &trusted\n    name: research\n").replace(
             b"  - name: partner-eval\n    namespace: partner-eval\n    trust: untrusted\n",
             b"  - <<: *trusted\n    name: partner-eval\n    namespace: partner-eval\n")}),
    Case("types", "a version in other digits (`toolkit_version: \"\u0661.18.2\"`)", ["validate", "--env",
                                                                                "inputs/dev.yaml"], 1,
         ["should match pattern", "the digits 0-9"],
         {"dev.yaml": _dev(b'toolkit_version: "1.18.2"', 'toolkit_version: "\u0661.18.2"'.encode())}),
    Case("types", "a host at a loopback address", ["validate", "--env", "inputs/dev.yaml"], 1, ["loopback"],
         {"dev.yaml": _dev(b"address: 10.40.3.11", b"address: 127.0.0.1")}),
    Case("types", "`gpu_count: true`", ["validate", "--env", "inputs/dev.yaml"], 1, ["YAML read True, a boolean"],
         {"dev.yaml": _dev(b"gpu_count: 4", b"gpu_count: true")}),
    Case("types", "`gpu_count: '4'`", ["validate", "--env", "inputs/dev.yaml"], 1, ["YAML read '4', text"],
         {"dev.yaml": _dev(b"gpu_count: 4", b"gpu_count: '4'")}),
    Case("types", "a misspelt key", ["validate", "--env", "inputs/dev.yaml"], 1, ["unknown key", "did you mean"],
         {"dev.yaml": _dev(b"gpu_count: 4", b"gpu_cout: 4")}),
    Case("bounds", "a MIG count of a hundred million", ["mig", "validate", "--gpu", "NVIDIA A100-SXM4-80GB",
                                                        "--layout", "1g.10gb=100000000"], 2,
         ["more than any GPU holds"]),
    Case("bounds", "a MIG count above the model's limit", ["mig", "validate", "--gpu", "NVIDIA A100-SXM4-80GB",
                                                           "--layout", "1g.10gb=8"], 1, ["allows at most 7"]),
    Case("bounds", "a profile named twice in a layout", ["mig", "validate", "--gpu", "NVIDIA A100-SXM4-80GB",
                                                         "--layout", "1g.10gb=2,1g.10gb=3"], 2, ["appears twice"]),
    Case("bounds", "GPU count above a node's 16", ["validate", "--env", "inputs/dev.yaml"], 1, ["less than or equal"],
         {"dev.yaml": _dev(b"gpu_count: 4", b"gpu_count: 17")}),
    Case("bounds", "guaranteed quota above the cluster (pilot: an error)", ["validate", "--env", "inputs/pilot.yaml"],
         1, ["tenants are guaranteed", "quota_above_capacity"]),
    Case("bounds", "guaranteed quota above the cluster (dev: a warning)", ["validate", "--env", "inputs/dev.yaml"], 0,
         ["warning", "tenants are guaranteed"], {"dev.yaml": _dev(b"nvidia.com/gpu: 8", b"nvidia.com/gpu: 400")}),
    Case("output", "`render --out` names a file", ["render", "--env", "dev", "--out", "Pulumi.yaml"], 2,
         ["existing file"]),
    Case("output", "`render --out` would replace the inputs", ["render", "--env", "dev", "--out", "."], 2,
         ["would replace input"]),
    Case("output", "`render --out` inside the profiles", ["render", "--env", "dev", "--out", "profiles/build"], 2,
         ["inside the input directory"]),
    Case("output", "`pack --env-out` names a directory", ["pack", "--demand", "examples/demand/inference.yaml",
                                                         "--env-out", "inputs/dir.yaml"], 2, ["names a directory"]),
    Case("option", "`capacity --prometheus` is not a URL", ["capacity", "--env", "dev", "--prometheus", "not a url"],
         2, ["not an http(s) URL"]),
    Case("option", "`check --today` is not a date", ["check", "--env", "dev", "--no-plan", "--today", "2026-02-30"],
         2, ["not a date"]),
    Case("option", "`promote` from an environment to itself", ["promote", "--from", "prod", "--to", "prod"], 2,
         ["both name prod"]),
    Case("option", "`pack --gpus` names a model twice", ["pack", "--demand", "examples/demand/inference.yaml",
                                                        "--gpus", "NVIDIA L4=2,NVIDIA L4=3"], 2, ["listed twice"]),
    Case("adoption", "`import` from dumps with no GPU node", ["import", "--from", "environments", "--env", "adopted",
                                                                "--out", "."], 2, ["no GPU node to import"]),
    Case("option", "`check --waivers` names a missing file", ["check", "--env", "dev", "--no-plan", "--waivers",
                                                              "inputs/missing.yaml"], 2, ["not found"]),
    Case("yaml", "aliases that expand to a billion values", ["validate", "--env", "inputs/dev.yaml"], 1,
         ["expand to more than"], {"dev.yaml": seed("dev.yaml") + _BOMB}),
    Case("option", "`showback --end nan`", ["showback", "--env", "dev", "--prometheus", "http://127.0.0.1:9",
                                             "--end", "nan"], 2, ["not a finite number"]),
    Case("option", "`pack --time-limit nan`", ["pack", "--demand", "examples/demand/inference.yaml",
                                                "--time-limit", "nan"], 2, ["not a finite number"]),
    Case("option", "`promote --at 1e300`", ["promote", "--from", "pilot", "--to", "prod", "--at", "1e300"], 2,
         ["between 1970 and 9999"]),
    Case("option", "`capacity --window` of a billion days", ["capacity", "--env", "dev", "--prometheus",
                                                             "http://127.0.0.1:9", "--window", "99999999999d"], 2,
         ["longer than 400 days"]),
    Case("prices", "a price of `.inf`", ["showback", "--env", "dev", "--prometheus", "http://127.0.0.1:9",
                                         "--prices", "inputs/prices.yaml"], 1, ["finite number"],
         {"prices.yaml": b"apiVersion: gpushare.io/v1\nkind: Prices\ncurrency: EUR\nhourly: {L4: .inf}\n"}),
    Case("prices", "a model priced under two of its names", ["showback", "--env", "dev", "--prometheus",
                                                             "http://127.0.0.1:9", "--prices", "inputs/prices.yaml"],
         1, ["priced twice"], {"prices.yaml": b"apiVersion: gpushare.io/v1\nkind: Prices\ncurrency: EUR\n"
                               b"hourly: {NVIDIA A100-SXM4-80GB: 2, A800-80GB: 3}\n"}),
    Case("adoption", "a dump whose GPU count label is unquoted", ["import", "--from", "inputs/dumps", "--env",
                                                                   "adopted", "--out", "."], 2,
         ["metadata.labels[nvidia.com/gpu.count]"], {"dumps/nodes.yaml": _node_dump(b"nvidia.com/gpu.count: 8")}),
    Case("adoption", "a dump whose taint is a string", ["drift", "--env", "dev", "--from", "inputs/dumps"], 2,
         ["spec.taints[0]"], {"dumps/nodes.yaml": _node_dump(b'nvidia.com/gpu.count: "8"',
                                                             b"taints: [gpu=true:NoSchedule]")}),
    Case("adoption", "a dump whose managedFields time is not a time", ["drift", "--env", "dev", "--from",
                                                                       "inputs/dumps"], 2, ["RFC 3339"],
         {"dumps/nodes.yaml": _node_dump(b'nvidia.com/gpu.count: "8"', b"taints: []",
                                         b"managedFields: [{manager: gfd, time: yesterday}]")}),
    Case("rollout", "a journal line of the wrong shape", ["rollout", "--env", "dev", "--resume", "--dry-run",
                                                          "--journal", "inputs/journal.jsonl"], 2,
         ["journal.jsonl:1", "batches"], {"journal.jsonl": b'{"event": "start", "rollout": "dev-1", "env": "dev", '
                                          b'"batches": "dev-gpu-01", "snapshot": {}}\n'}),
    Case("rollout", "a journal snapshot name that leads out of its folder", ["rollout", "--env", "dev", "--resume",
                                                                            "--dry-run", "--journal",
                                                                            "inputs/journal.jsonl"], 2,
         ["not a plain file name"], {"journal.jsonl": b'{"event": "start", "rollout": "dev-1", "env": "dev", '
                                     b'"batches": [], "snapshot": {"name": "../../../evil.yaml", "text": "", '
                                     b'"profiles": {}}}\n'}),
    Case("site", "a newline in an apt mirror URI in `group_vars/` (it would add `Trusted: yes`)",
         ["validate", "--env", "inputs/dev.yaml"], 1, ["group_vars/all.yml:2: dcgm_apt_uri", "U+000A"],
         {"dev.yaml": seed("dev.yaml"),
          "group_vars/all.yml": b'# the site mirror\ndcgm_apt_uri: "https://mirror.example/cuda\\nTrusted: yes"\n'}),
    # ---- issue 39, third round: files at the edges
    Case("output", "`pack --env-out` names the fleet's own environment file", [
        "pack", "--fleet", "dev", "--demand", "examples/demand/inference.yaml", "--env-out", "environments/dev.yaml"],
         2, ["would replace input"]),
    Case("file", "a profile that is a symbolic link to itself", ["validate", "--env", "inputs/dev.yaml", "--profiles",
                                                                  "inputs/profiles"], 2,
         ["profiles/loop.yaml: profile file is a symbolic link in a loop"], {"dev.yaml": seed("dev.yaml")},
         links={"profiles/loop.yaml": "loop.yaml"}),
    Case("adoption", "`drift --kubeconfig` names a file that is not YAML", ["drift", "--env", "dev", "--kubeconfig",
                                                                           "inputs/kubeconfig"], 2,
         ["not a kubeconfig: not valid YAML"], {"kubeconfig": b"apiVersion: v1\nclusters: [\n"}),
    Case("file", "a terminal escape (`ESC[31m`) in the `--env` file name is shown, not sent", [
        "validate", "--env", "inputs/\x1b[31mred.yaml"], 1, ["\\x1b[31mred.yaml"],
         {"\x1b[31mred.yaml": seed("dev.yaml")}),
    # ---- issue 39, third round: AWX options and the bound on a server's answer
    Case("rollout", "an `--awx-template` ID in other digits (`rollout.yml=\u00b2`: `isdigit()` takes it, `int()` "
         "does not)", ["rollout", "--env", "dev", "--dry-run", "--awx-url", "https://awx.example.com",
                       "--awx-template", "rollout.yml=\u00b2", "--awx-template", "verify.yml=6"], 2,
         ["is not a number from 1 written in the digits 0-9"]),
    Case("rollout", "one playbook's `--awx-template` given twice (the last won)", [
        "rollout", "--env", "dev", "--dry-run", "--awx-url", "https://awx.example.com", "--awx-template",
        "rollout.yml=5", "--awx-template", "rollout.yml=7", "--awx-template", "verify.yml=6"], 2,
         ["rollout.yml is given twice"]),
    Case("rollout", "an `--awx-url` with a space", ["rollout", "--env", "dev", "--dry-run", "--awx-url",
                                                   "https://awx example.com", "--awx-template", "rollout.yml=5",
                                                   "--awx-template", "verify.yml=6"], 2, ["it has a space"]),
    Case("option", "`showback --timeout nan`", ["showback", "--env", "dev", "--prometheus", "http://127.0.0.1:9",
                                                 "--timeout", "nan"], 2, ["not a finite number"]),
]


@dataclass
class Elsewhere:
    """Bad input the worker cannot produce (a host's files under Ansible, a full disk, two processes at once, a
    cluster's ConfigMaps): its row quotes the words the named test asserts."""

    kind: str
    input: str
    run: str
    code: str
    says: str
    test: str


_BAD_STATE = "tests/ansible/test_ansible_bad_state.py"
_FILES = "tests/unit/cli/test_file_system_edges.py"
_CONFIGMAPS = "tests/unit/ops/brownfield/test_objects.py"
_AWX = "tests/ansible/test_ansible_awx.py"
_SILENT = "tests/unit/ops/test_timeouts.py"

ELSEWHERE = [
    Elsewhere("collection", "gpushare's state file on a host is not JSON, a JSON list or a directory",
              "`ansible localhost -m gpushare.fleet.gpushare_state` (also `host_read`, `dcgm_diag`)", "task failed",
              "host HOST: /var/lib/gpushare/state.json: not JSON (line 2, column 1 ...) / the top level is a JSON list "
              "/ is a directory ...; the file was left as it is (fix: ...)", _BAD_STATE),
    Elsewhere("collection", "`dcgmi diag --json` with `test_categories` a string or `results` a number",
              "`gpushare.fleet.dcgm_diag`", "task failed",
              "host HOST: `/usr/bin/dcgmi diag -r 1 --json` gave no usable report (rc 0): field 'DCGM "
              "Diagnostic'.test_categories is a string (\"Deployment\"), not a list of objects; nothing was recorded "
              "... (fix: ...)", _BAD_STATE),
    Elsewhere("collection", "`kubectl` answers with something that is not JSON", "`gpushare.fleet.kube_node`",
              "task failed", "node gpu-01: `kubectl get node gpu-01 -o json` printed something that is not JSON ...; "
              "stopped there (kubectl commands that changed the node before: none) (fix: ...)", _BAD_STATE),
    Elsewhere("collection", "the host's containerd `config.toml` is not TOML", "`gpushare.fleet.containerd_runtime`",
              "task failed", "host HOST: option config_path: /etc/containerd/config.toml is not TOML: ... (at line 2, "
              "column ...); nothing was written (fix: ...)", _BAD_STATE),
    Elsewhere("collection", "a CDI spec path that is a directory", "`gpushare.fleet.cdi_spec`", "task failed",
              "host HOST: option path /var/run/cdi/nvidia.yaml is a directory, not the spec's file; nothing was "
              "written (fix: ...)", _BAD_STATE),
    Elsewhere("output", "a full disk (a tmpfs of 4 MiB, filled)", "`gpushare schema --out`, `preview --out`, `init`, "
              "`init --example`, `capacity --backfill-rules`", "2",
              "PATH: cannot write: No space left on device (the file system is full); nothing was written and what "
              "this command had created is removed fix: free space on the file system ...", _FILES),
    Elsewhere("output", "two `gpushare init` of one new directory at once", "`gpushare init fleet` twice", "0 and 2",
              "fleet: another process wrote into the workspace directory while init was building the workspace ...",
              _FILES),
    Elsewhere("adoption", "a device-plugin config with `replicas: 0` in the ConfigMap the operator mounts",
              "`gpushare import --from DIR`", "0, reported",
              "Node/l40s-01 labels[nvidia.com/device-plugin.config]: device-plugin config 'ts-2': in ConfigMap "
              "'time-slicing-config' ... cannot be read: sharing.timeSlicing.resources[0].replicas: replicas is 0: "
              "the device plugin refuses fewer than 2 ...; the node is left out", _CONFIGMAPS),
    Elsewhere("adoption", "a mig-parted config with a negative `mig-devices` count, or not a list",
              "`gpushare import --from DIR`", "0, reported",
              "MIG config 'all-balanced': in ConfigMap 'custom-mig-config' ... cannot be read: "
              "mig-configs.all-balanced[0].mig-devices: mig-devices[1g.10gb] is -2: mig-parted refuses a negative "
              "count ...; the node is left out", _CONFIGMAPS),
    # ---- issue 39, third round: servers that answer otherwise, or not at all
    Elsewhere("rollout", "AWX answers a job launch with a login page or cut-off JSON",
              "`gpushare rollout --awx-url URL --awx-template rollout.yml=5 --awx-template verify.yml=6`", "2",
              "AWX job template 5 (rollout.yml): AWX POST /api/v2/job_templates/5/launch/ answered not JSON but "
              "text/html ('<!DOCTYPE html>...'...) / JSON cut off or broken (...) (fix: check that --awx-url is the "
              "controller's own address ...)", _AWX),
    Elsewhere("rollout", "a launch answer of `[]`, without a job id, or with one that is not a number",
              "`gpushare rollout --awx-url URL ...`", "2",
              "AWX job template 5 (rollout.yml): AWX POST ... answered []: Input should be a valid dictionary ... / "
              "job: no job number (neither `job` nor `id`) ... / job: Input should be a valid integer (it holds "
              "\"seven\"), in the answer to AWX POST /api/v2/job_templates/5/launch/ (fix: ...)", _AWX),
    Elsewhere("rollout", "a job's status nested 100,000 levels deep, missing (it was polled for 6 hours), or not one "
              "AWX has", "`gpushare rollout --awx-url URL ...`", "2",
              "AWX job 1 (rollout.yml): status: Field required (it holds {\"id\": 1, ...}), in the answer to AWX GET "
              "/api/v2/jobs/1/; the job's state is unknown, so it was canceled (fix: ...)", _AWX),
    Elsewhere("rollout", "host summaries without `host_name` or with counts that are not numbers; failed events "
              "that are not objects", "`gpushare rollout --awx-url URL ...`", "2",
              "AWX job 1 (rollout.yml): results[0].host_name: Field required / results[0].failures: Input should be "
              "a valid integer (it holds \"many\") / results[0]: Input should be a valid dictionary ..., in the "
              "answer to AWX GET .../job_host_summaries/... (fix: ...)", _AWX),
    Elsewhere("rollout", "a `next` link to the page itself (or to one already read)",
              "`gpushare rollout --awx-url URL ...`", "2",
              "AWX job 1 (rollout.yml): next: AWX GET URL: its next page URL was already read; the pages loop, so the "
              "job's results are not complete (fix: ...)", _AWX),
    Elsewhere("rollout", "a job that never finishes", "`gpushare rollout --awx-url URL ... --awx-job-timeout 1`", "1",
              "AWX job 1 did not finish within --awx-job-timeout 1 s; it was canceled", _AWX),
    Elsewhere("rollout", "an AWX controller that accepts and stays silent, or trickles its answer",
              "`gpushare rollout --awx-url URL ... --timeout 1.5`", "2",
              "AWX job template 5 (rollout.yml): AWX GET /api/v2/job_templates/5/launch/: no answer / ... bytes of an "
              "answer within 2 s, gpushare's bound on one request (--timeout 1.5 s, ...) (fix: ...)", _AWX),
    Elsewhere("server", "a Prometheus that accepts and never answers, sends its headers a byte at a time, or "
              "trickles its body", "`gpushare showback`, `capacity`, `promote` with `--timeout 1.5` (or "
              "`GPUSHARE_TIMEOUT=1.5`)", "2",
              "Prometheus at URL sent no answer to the ... query within 2 s, gpushare's bound on one query (--timeout "
              "1.5 s, from the connection to the answer's last byte) (fix: ...; if the server is only slow, raise "
              "--timeout (or $GPUSHARE_TIMEOUT) ...)", _SILENT),
    Elsewhere("server", "a Kubernetes API server that does the same", "`gpushare import`, `drift` with "
              "`--kubeconfig FILE --timeout 1.5`", "2",
              "FILE: the API server did not answer the list of Nodes within the bound of 1.5 s to connect and 1.5 s "
              "per list call (--timeout) (fix: ...)", _SILENT),
    Elsewhere("server", "Ctrl-C while `capacity` waits on a silent Prometheus",
              "`gpushare capacity ... --timeout 60`, then SIGINT", "130",
              "ends within 2 s (it took about 140 s), its connections closed", _SILENT),
]


def run_case(worker: Worker, case: Case) -> Result:
    files = dict(case.files)
    if case.input.startswith("guaranteed quota above the cluster (pilot"):
        files["pilot.yaml"] = _pilot_over_quota(worker.workspace)
    for name, data in files.items():
        path = worker.workspace / "inputs" / name
        path.parent.mkdir(parents=True, exist_ok=True)  # a folder of dumps
        path.write_bytes(data)
    for name, target in case.links.items():
        (worker.workspace / "inputs" / name).symlink_to(target)
    try:
        return worker.run(case.args)
    finally:
        for name in case.links:
            (worker.workspace / "inputs" / name).unlink()
        for name in files:
            path = worker.workspace / "inputs" / name
            path.unlink()
            if path.parent.name != "inputs" and not any(path.parent.iterdir()):
                path.parent.rmdir()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _answer(result: Result) -> str:
    lines = [line.strip() for line in result.text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("error: ")][:3]
    return " ".join(line[:220] for line in lines)


def render_doc(rows: list[tuple[Case, Result]]) -> str:
    out = [
        "# Bad input: what gpushare says",
        "",
        "Written by `tests/contract/test_catalogue.py` from real runs (regenerate with",
        "`GPUSHARE_WRITE_CATALOGUE=1 .venv/bin/pytest tests/contract/test_catalogue.py`); a test fails when this page",
        "and gpushare's answers differ. Exit codes: 0 ok, 1 invalid input or a failed check, 2 unusable input or",
        "options, 3 no GPU or NVML, 70 an internal error (a bug: the message says how to report it). Generated",
        "input of every kind is thrown at every command by `tests/contract/test_contract_fuzz.py` under a 1.5 GiB",
        "address-space limit.",
        "",
        "| kind | input | command | exit | what gpushare says |",
        "|---|---|---|---|---|",
    ]
    for case, result in rows:
        command = "gpushare " + " ".join(a if " " not in a and a else repr(a) for a in case.args)
        out.append(f"| {case.kind} | {_cell(case.input)} | `{_cell(printable(command))}` | {result.code} | "
                   f"{_cell(_answer(result))} |")
    out += [
        "",
        "## Checked where they can run",
        "",
        "Bad input this page's worker cannot produce: a host's files and tools under Ansible (each module run as",
        "Ansible runs it), a full disk (a tmpfs the test mounts), two processes at once, a cluster's ConfigMaps.",
        "Each row quotes what the test it names asserts (`...` stands for what varies: paths, the host, the",
        "parser's words). Servers that answer otherwise than their API does, or not at all, are stand-ins on",
        "127.0.0.1 (of AWX, Prometheus and the Kubernetes API).",
        "",
        "| kind | input | run | exit | what gpushare says | test |",
        "|---|---|---|---|---|---|",
    ]
    for row in ELSEWHERE:
        out.append(f"| {row.kind} | {_cell(row.input)} | {_cell(row.run)} | {row.code} | {_cell(row.says)} | "
                   f"`{row.test}` |")
    return "\n".join(out) + "\n"
