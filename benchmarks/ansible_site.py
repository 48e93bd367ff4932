"""Ansible benchmark: `site.yml` against 1, 4 and 8 isolated test hosts (tests/ansible/testbed.py: debootstrap'd
Debian booted with systemd-nspawn, simulated GPUs), forks >= 8, each host set fresh; then a converged rerun on the
smallest and the largest set. Prints the wall-time ratio of 8 hosts to 1 (target <= 3.0) and of the converged rerun
to the first run (target <= 0.5), and the controller CPU each added host costs, fresh (target <= 4 s) and converged
(target <= 1.5 s): differences within one run, so the machine's other work cancels out as far as it can. Needs root,
like the Ansible tests; nothing here is a pass/fail test.

    python benchmarks/ansible_site.py [--sizes 1,4,8] [--forks 10] [--profile] [--mitogen]

--mitogen runs the same playbook under Mitogen's mitogen_free strategy, as `gpushare ansible-env --mitogen` sets it.

Each run is a plain `ansible-playbook -i ENV playbooks/site.yml` process started the way a user starts it (the
project's ansible.cfg, fresh ssh connections); its log is kept under build/ansible/logs/<pid>/. With --profile a
callback (benchmarks/callback_plugins/task_times.py) records every task result's duration, and the slowest tasks
and roles are printed per run (host-seconds: summed over hosts), and ansible-playbook's main process runs under
cProfile (its functions by own time are printed; the profiler roughly doubles that process's CPU).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import pstats
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ansible.controller import ENVIRONMENTS, Controller  # noqa: E402 - after the path set-up
from tests.ansible.testbed import HostSpec, Testbed  # noqa: E402

# Host i gets the i-th model of this cycle (the three pools of the testbed environment).
CYCLE = [
    ("a100-inference", "NVIDIA A100-SXM4-80GB", 8, True),
    ("h100-llm-serving", "NVIDIA H100 80GB HBM3", 8, True),
    ("l4-notebooks", "NVIDIA L4", 4, False),
]


def host_specs(count: int) -> list[HostSpec]:
    """`count` hosts spread over the testbed environment's pools (A100 x8, H100 x8, L4 x4, A100 x8, ...)."""
    return [HostSpec(f"bench-{i + 1:02d}", model, gpus, nvswitch=nvswitch)
            for i, (_, model, gpus, nvswitch) in enumerate(CYCLE[i % len(CYCLE)] for i in range(count))]


def environment(bed: Testbed, directory: Path) -> Path:
    """The testbed environment with the benchmark's hosts (at the addresses they got) in its pools."""
    data = yaml.safe_load((ENVIRONMENTS / "testbed.yaml").read_text())
    data["name"] = f"bench{len(bed.hosts)}"
    pools = {p["name"]: p for p in data["pools"]}
    for pool in pools.values():
        pool["hosts"] = []
    for i, host in enumerate(bed.hosts):
        pool = CYCLE[i % len(CYCLE)][0]
        pools[pool]["hosts"].append({"name": host.name, "address": host.address, "gpu_count": host.spec.gpu_count,
                                     "nvswitch": host.spec.nvswitch})
    data["pools"] = [p for p in data["pools"] if p["hosts"]]
    advertised = {"a100-inference": "nvidia.com/mig-3g.40gb", "l4-notebooks": "nvidia.com/gpu.shared"}
    present = {advertised[p["name"]] for p in data["pools"] if p["name"] in advertised}
    data["tenants"] = [t for t in data["tenants"] if set(t["quota"]) <= present]
    env_dir = directory / "environments"
    (env_dir / "group_vars").mkdir(parents=True, exist_ok=True)
    (env_dir / "group_vars" / "all.yml").write_text((ENVIRONMENTS / "group_vars" / "all.yml").read_text())
    path = env_dir / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ansible-playbook's own entry point, run in this wrapper's process so that the main process's CPU (the strategy's
# loop, includes, results, callbacks) is told apart from its forks' and commands'; with --profile, under cProfile
# (the forks stop profiling: they run tasks, which the task timings cover).
MAIN_PROCESS = r"""
import cProfile, json, os, resource, runpy, sys
out, profile, script = sys.argv[1], sys.argv[2], sys.argv[3]
sys.argv = sys.argv[3:]
prof = cProfile.Profile() if profile else None
if prof:
    os.register_at_fork(after_in_child=prof.disable)
    prof.enable()
try:
    runpy.run_path(script, run_name="__main__")
finally:
    if prof:
        prof.disable()
        prof.dump_stats(profile)
    me = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as f:
        json.dump({"main_cpu_s": me.ru_utime + me.ru_stime}, f)
"""


@dataclass
class Run:
    wall_s: float
    controller_cpu_s: float  # ansible-playbook and everything it started on this machine (forks, ssh, kubectl)
    main_cpu_s: float  # of which ansible-playbook's main process (strategy loop, includes, results, callbacks)
    machine_cpu_s: float  # all CPUs of the machine busy: controller, test hosts, and any other work running
    load: float  # 1-minute load average when the run started
    recap: dict[str, dict[str, int]]


def user_env(ctl: Controller, control_dir: Path, times: Path | None) -> dict[str, str]:
    """What a user's shell gives ansible-playbook: the project's ansible.cfg as it is (forks, pipelining, ssh
    ControlPersist, interpreter discovery), an ssh key and known host keys (here: the test hosts' generated ones, not
    checked), kubectl on PATH (the recording test double). Only the ssh control sockets are fresh per run, so a rerun
    does not inherit the first run's open connections."""
    test_env = ctl.env()
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "ansible.cfg")
    profile = {} if times is None else {
        "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "benchmarks" / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "task_times", "GPUSHARE_TASK_TIMES": str(times)}
    return {
        **os.environ,
        **profile,
        **MITOGEN,
        "PATH": test_env["PATH"],
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_PRIVATE_KEY_FILE": test_env["ANSIBLE_PRIVATE_KEY_FILE"],
        "ANSIBLE_SSH_ARGS": cfg["ssh_connection"]["ssh_args"]
        + " -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        "KUBECTL_DOUBLE_STATE": test_env["KUBECTL_DOUBLE_STATE"],
        "KUBECTL_DOUBLE_LOG": test_env["KUBECTL_DOUBLE_LOG"],
    }


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# --mitogen: site.yml under Mitogen's mitogen_free strategy, set as `gpushare ansible-env --mitogen` sets it (the
# gpushare[mitogen] extra installed). Mitogen runs ssh itself and checks host keys by Ansible's setting, not by the
# ssh_args (the test hosts' keys are generated per run, as the plain runs' ssh_args say).
MITOGEN: dict[str, str] = {}


def site(ctl: Controller, env: Path, forks: int, label: str, profile: bool) -> Run:
    """One plain `ansible-playbook -i ENV playbooks/site.yml` run, as a user starts it: its wall time, CPU time and
    PLAY RECAP per host."""
    log = ctl.logs / f"{label}.log"
    control_dir = Path(tempfile.mkdtemp(prefix=f"cp-{label}-", dir=ctl.workdir))
    times = ctl.logs / f"{label}.times.jsonl" if profile else None
    main_out, main_prof = ctl.logs / f"{label}.main.json", ctl.logs / f"{label}.main.prof"
    cmd = [sys.executable, "-c", MAIN_PROCESS, str(main_out), str(main_prof) if profile else "",
           str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(env), "playbooks/site.yml",
           "-f", str(forks), "-e", f"gpushare_kubeconfig={ctl.kubeconfig}"]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = busy_cpu_s()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=ROOT, env=user_env(ctl, control_dir, times), stdout=out,
                            stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    busy = busy_cpu_s() - busy
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    controller = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    recap = {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
             for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", log.read_text(), re.M)}
    if rc != 0 or not recap or any(r["failed"] or r["unreachable"] for r in recap.values()):
        raise SystemExit(f"site.yml failed ({label}, rc={rc}); see {log}")
    main_cpu = json.loads(main_out.read_text())["main_cpu_s"]
    if times is not None:
        print_profile(label, times)
        print_main_profile(main_prof)
    return Run(wall, controller, main_cpu, busy, load, recap)


def print_main_profile(path: Path, top: int = 15) -> None:
    """The main process's functions by their own time (cProfile), where the controller's share per task goes."""
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda i: -i[1][2])[:top]  # type: ignore[attr-defined]
    print("  main process, own time (cProfile):")
    for (file, line, name), (_, calls, own, cumulative, _) in rows:
        print(f"  {own:6.2f} s own {cumulative:7.2f} s cum {calls:8d} calls  {Path(file).name}:{line} {name}")


def print_profile(label: str, times: Path, top: int = 12) -> None:
    records = [json.loads(line) for line in times.read_text().splitlines()]
    spent = [(r, r["end"] - r["start"]) for r in records if r["start"] is not None]
    by_task: dict[tuple[str, str], list[float]] = {}
    by_role: dict[str, float] = {}
    for r, seconds in spent:
        by_task.setdefault((r["role"], r["task"]), []).append(seconds)
        by_role[r["role"] or "(play)"] = by_role.get(r["role"] or "(play)", 0.0) + seconds
    total = sum(s for _, s in spent)
    print(f"  {label}: {len(spent)} task results, {total:.0f} host-seconds in tasks", flush=True)
    print("  roles: " + ", ".join(f"{role} {s:.0f}" for role, s in sorted(by_role.items(), key=lambda i: -i[1])))
    for (_, task), seconds in sorted(by_task.items(), key=lambda i: -sum(i[1]))[:top]:
        print(f"  {sum(seconds):6.1f} host-s  {len(seconds):3d} x {sum(seconds) / len(seconds):5.2f} s  {task}")


def report(what: str, run: Run) -> None:
    tasks = sum(r["ok"] + r["skipped"] for r in run.recap.values())
    print(f"site.yml, {what}: {run.wall_s:6.1f} s (controller CPU {run.controller_cpu_s:5.1f} s, main process "
          f"{run.main_cpu_s:5.1f} s; machine CPU busy "
          f"{run.machine_cpu_s:5.1f} s, load {run.load:.1f} at the start; {tasks} task results)", flush=True)


def measure(count: int, forks: int, rerun: bool, profile: bool) -> tuple[Run, Run | None]:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp, \
            Testbed(host_specs(count), tag=f"bench{count}") as bed:
        env = environment(bed, Path(tmp))
        ctl = Controller(Path(tmp) / "controller", bed.hosts[0].key, forks=forks)
        ctl.seed_nodes({h.name: {"kubernetes.io/hostname": h.name} for h in bed.hosts})
        first = site(ctl, env, forks, f"bench{count}-first", profile)
        if not rerun:
            return first, None
        again = site(ctl, env, forks, f"bench{count}-rerun", profile)
        changed = sum(r["changed"] for r in again.recap.values())
        if changed:
            raise SystemExit(f"the rerun on {count} hosts was not converged: changed={changed}")
        return first, again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="time every task (a callback) and print the slowest, "
                        "and the main process's functions (cProfile)")
    parser.add_argument("--mitogen", action="store_true", help="run site.yml with Mitogen's mitogen_free strategy")
    args = parser.parse_args()
    if args.mitogen:
        from gpushare.core.paths import mitogen_environment

        MITOGEN.update(mitogen_environment(), ANSIBLE_HOST_KEY_CHECKING="False")
    if os.geteuid() != 0:
        raise SystemExit("needs root (systemd-nspawn, network namespaces), like the Ansible tests")
    sizes = [int(s) for s in args.sizes.split(",")]
    first: dict[int, Run] = {}
    again: dict[int, Run] = {}
    for count in sizes:
        # The smallest and largest sizes are rerun converged, so a converged host's cost is a difference too.
        run, rerun = measure(count, max(args.forks, 8), rerun=count in (min(sizes), max(sizes)), profile=args.profile)
        first[count] = run
        report(f"{count} fresh host(s)", run)
        if rerun is not None:
            again[count] = rerun
            report(f"{count} converged host(s) (rerun, changed=0)", rerun)
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} CPUs")
    small, large = min(sizes), max(sizes)
    if small != large:
        ratio = first[large].wall_s / first[small].wall_s
        print(f"ratio {large} hosts / {small} host: {ratio:.2f} (target <= 3.0: {'met' if ratio <= 3.0 else 'missed'})")
        for what, runs, target in (("fresh", first, 4.0), ("converged", again, 1.5)):
            added = (runs[large].controller_cpu_s - runs[small].controller_cpu_s) / (large - small)
            main = (runs[large].main_cpu_s - runs[small].main_cpu_s) / (large - small)
            print(f"controller CPU per added {what} host: {added:.2f} s, main process {main:.2f} s "
                  f"(target <= {target}: {'met' if added <= target else 'missed'})")
    ratio = again[large].wall_s / first[large].wall_s
    print(f"ratio converged rerun / first run ({large} hosts): {ratio:.2f} "
          f"(target <= 0.5: {'met' if ratio <= 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
