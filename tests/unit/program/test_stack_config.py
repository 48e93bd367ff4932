"""gpushare:localCharts and gpushare:skipAwait: a chart from disk replaces the published chart, its version and its
repository (Helm reads a directory as it is), and only the charts named; without them releases are as pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpushare.program.components import operator_values as ov
from gpushare.program.stack_config import ChartSource, StackConfig


def stack(**settings: object) -> StackConfig:
    return StackConfig.model_validate({"stack": "dev", "environment": "environments/dev.yaml", **settings})


def test_published_chart_by_default() -> None:
    args = stack().charts(Path("/ws")).release_args("gpu-operator", ov.CHART, ov.CHART_VERSION, ov.CHART_REPOSITORY)
    assert args["chart"] == ov.CHART and args["version"] == ov.CHART_VERSION
    assert args["repository_opts"].repo == ov.CHART_REPOSITORY
    assert "skip_await" not in args


def test_local_chart_relative_to_the_workspace_and_only_where_named() -> None:
    charts = stack(localCharts={"gpu-operator": "charts/gpu-operator"}, skipAwait=True).charts(Path("/ws"))
    local = charts.release_args("gpu-operator", ov.CHART, ov.CHART_VERSION, ov.CHART_REPOSITORY)
    assert local == {"chart": "/ws/charts/gpu-operator", "skip_await": True}
    published = charts.release_args("kueue", "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2")
    assert published == {"chart": "oci://registry.k8s.io/kueue/charts/kueue", "version": "0.19.2",
                         "skip_await": True}


def test_absolute_local_chart_kept() -> None:
    charts = stack(localCharts={"kueue": "/charts/kueue"}).charts(Path("/ws"))
    assert charts.release_args("kueue", "x", "1")["chart"] == "/charts/kueue"


def test_unknown_chart_refused() -> None:
    with pytest.raises(ValidationError):
        stack(localCharts={"gpu-operater": "x"})


def test_chart_source_default_is_published() -> None:
    assert ChartSource().release_args("kueue", "c", "1") == {"chart": "c", "version": "1"}
