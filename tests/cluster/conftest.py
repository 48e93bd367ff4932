"""Fixtures of the control-plane tests (marker `cluster`): one etcd per session and one API server, controller
manager, scheduler and kwok per cluster name, started on first use and stopped by PID at the end of the session,
also when a test fails. On a machine with Go the binaries must have been built (`make testbins`, which `make test`
runs): a missing binary fails the tests there; only a machine without Go skips them."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.cluster import bins as binaries
from tests.cluster.controlplane import Cluster, Etcd
from tests.cluster.environments import Applied, bring_up, preview
from tests.cluster.jobset import JobSetController
from tests.cluster.jobset import find as find_jobset
from tests.cluster.kube import Kube
from tests.cluster.kueue import KWOK_STAGES, Kueue, rendered_configuration, rendered_feature_gates
from tests.cluster.kueue import find as find_kueue
from tests.cluster.queues import Queues


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)


T = TypeVar("T")


def built_or_fail(found: T | None, why: str) -> T:
    """What `make testbins` built; missing, a failure where Go is (the build step failed), a skip only without Go."""
    if found is None:
        if shutil.which("go") is None:
            pytest.skip(f"no Go toolchain on this machine: {why}")
        pytest.fail(why)
    return found


@pytest.fixture(scope="session")
def cluster_bins() -> binaries.Binaries:
    return built_or_fail(*binaries.find())


@pytest.fixture(scope="session")
def cluster_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpushare-controlplane-"))
    yield folder
    if os.environ.get("GPUSHARE_KEEP_CLUSTER_LOGS"):  # certificates, kubeconfigs and every program's log
        print(f"control-plane folder kept: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd(cluster_bins: binaries.Binaries, cluster_folder: Path) -> Iterator[Etcd]:
    server = Etcd(cluster_bins, cluster_folder / "etcd")
    yield server
    server.stop()


ClusterFactory = Callable[[str], tuple[Cluster, Kube]]


@pytest.fixture(scope="session")
def clusters(cluster_bins: binaries.Binaries, etcd: Etcd, cluster_folder: Path) -> Iterator[ClusterFactory]:
    """`clusters(name)`: the running cluster of that name (started on first use) and an admin client for it."""
    running: dict[str, tuple[Cluster, Kube]] = {}

    def get(name: str) -> tuple[Cluster, Kube]:
        if name not in running:
            cluster = Cluster(name, cluster_bins, etcd, cluster_folder / name)
            running[name] = (cluster, Kube(cluster.kubeconfig))
        cluster, kube = running[name]
        dead = cluster.alive()
        assert not dead, "\n".join(dead)
        return cluster, kube

    try:
        yield get
    finally:
        for cluster, _ in running.values():
            cluster.stop()


@pytest.fixture(scope="session")
def applied(clusters: ClusterFactory, cluster_folder: Path) -> Callable[[str, str], Applied]:
    """`applied(env, cluster)`: that cluster of the environment on an API server of its own, with the CRDs, kwok
    nodes from the plan and every object of `gpushare preview` applied once (the first answers kept)."""
    done: dict[tuple[str, str], Applied] = {}

    def get(env: str, cluster: str) -> Applied:
        if (env, cluster) not in done:
            _, kube = clusters(f"{env}-{cluster}")
            done[(env, cluster)] = bring_up(env, cluster, kube, cluster_folder / f"preview-{env}")
        return done[(env, cluster)]

    return get


@pytest.fixture(scope="session")
def kueue_build() -> Path:
    """Kueue's build folder (tools/gobuild.sh kueue, which `make testbins` runs)."""
    return built_or_fail(*find_kueue())


@pytest.fixture(scope="session")
def queues(cluster_bins: binaries.Binaries, etcd: Etcd, cluster_folder: Path, kueue_build: Path
           ) -> Iterator[Callable[..., Queues]]:
    """`queues(env, cluster)`: that cluster of the environment on an API server of its own (kwok pods run until a
    test ends them), Kueue's own controller manager configured as gpushare renders it for the cluster, then every
    object of the preview applied through Kueue's webhooks. `queues(env, cluster, name=...)` starts another one;
    `jobset=True` runs the JobSet controller there too, started before Kueue so its JobSet integration finds the
    CRD."""
    running: dict[str, tuple[Cluster, Kueue | None, Queues | None]] = {}
    jobsets: list[JobSetController] = []

    def get(env: str, cluster: str, name: str = "", jobset: bool = False) -> Queues:
        name = name or f"kueue-{env}-{cluster}"
        if name not in running:
            out = cluster_folder / f"preview-{env}"
            preview(env, out)
            control = Cluster(name, cluster_bins, etcd, cluster_folder / name, kwok_config=KWOK_STAGES)
            running[name] = (control, None, None)
            kube = Kube(control.kubeconfig)
            if jobset:
                jobsets.append(JobSetController.start(control, kube, built_or_fail(*find_jobset()),
                                                      cluster_folder / name / "jobset"))
            values = out / "helm-values" / cluster / "kueue.yaml"
            manager = Kueue.start(control, kube, kueue_build, rendered_configuration(values),
                                  cluster_folder / name / "kueue", rendered_feature_gates(values))
            running[name] = (control, manager, None)
            running[name] = (control, manager, Queues(bring_up(env, cluster, kube, out), manager))
        control, manager, found = running[name]
        dead = control.alive() + ([manager.alive()] if manager and manager.alive() else [])
        dead += [j.alive() for j in jobsets if j.cluster is control and j.alive()]
        assert not dead, "\n".join(dead)
        assert found is not None
        return found

    try:
        yield get
    finally:
        for control, manager, _ in running.values():
            if manager is not None:
                manager.stop()
            for j in jobsets:
                if j.cluster is control:
                    j.stop()
            control.stop()
