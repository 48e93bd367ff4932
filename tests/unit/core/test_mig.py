"""The exact MIG layout check on hand-checked layouts, the layout syntax, and NVIDIA's shipped named configs.

Every expected placement below was worked out by hand from the profile tables in mig_profiles.yaml.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpushare.core.catalog import GpuModel, load_catalog
from gpushare.core.errors import GpushareError
from gpushare.core.mig import (
    Instance,
    MigCheck,
    Placement,
    check_layout,
    format_layout,
    layout_counts,
    layout_from_counts,
    parse_layout,
)
from tests.conftest import ROOT

H100 = "NVIDIA H100 80GB HBM3"
A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
A30 = "NVIDIA A30"
H100_NVL = "NVIDIA H100 NVL"
DEFAULT_CONFIGS = ROOT / "tests" / "data" / "default_mig_configs.yaml"


def model(name: str) -> GpuModel:
    return load_catalog().models[name]


def check(gpu: str, layout: str, driver_branch: int | None = None) -> MigCheck:
    return check_layout(model(gpu), parse_layout(layout), driver_branch)


def starts(result: MigCheck) -> list[tuple[str, int]]:
    return [(p.profile, p.start) for p in result.placements]


def assert_invalid(result: MigCheck, *fragments: str) -> str:
    """Invalid, and one error names the GPU and holds every fragment (profile and reason)."""
    assert not result.ok and result.placements == []
    matching = [e for e in result.errors if result.gpu in e and all(f in e for f in fragments)]
    assert matching, result.errors
    return matching[0]


# --- valid layouts, with the witness worked out by hand -----------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "layout", "witness"),
    [
        (H100, "4g.40gb=1,3g.40gb=1", [("4g.40gb", 0), ("3g.40gb", 4)]),
        (
            H100,
            "1g.10gb=2,2g.20gb=1,3g.40gb=1",
            [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)],
        ),
        (H100, "2g.20gb=3,1g.10gb=1", [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]),
        (H100, "4g.40gb,2g.20gb,1g.20gb", [("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)]),
        (H100, "3g.40gb@4,4g.40gb", [("4g.40gb", 0), ("3g.40gb", 4)]),
        (H100, "1g.10gb=7", [("1g.10gb", s) for s in range(7)]),
        (H100, "7g.80gb", [("7g.80gb", 0)]),
        (H100, "", []),
        (A100_40, "1g.10gb=4", [("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6)]),
        (A100_40, "2g.10gb=3,1g.5gb=1", [("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6)]),
        (A100_40, "3g.20gb,2g.10gb,1g.5gb=2", [("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)]),
        (A100_40, "1g.5gb=7", [("1g.5gb", s) for s in range(7)]),
        (A100_80, "1g.10gb=7", [("1g.10gb", s) for s in range(7)]),
        (A100_80, "1g.20gb=4", [("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)]),
        (A30, "1g.6gb+me,2g.12gb,1g.6gb", [("1g.6gb", 0), ("1g.6gb+me", 1), ("2g.12gb", 2)]),
        (A30, "2g.12gb=2", [("2g.12gb", 0), ("2g.12gb", 2)]),
        (A30, "4g.24gb", [("4g.24gb", 0)]),
        (
            H100_NVL,
            "1g.12gb=2,2g.24gb,3g.47gb",
            [("1g.12gb", 0), ("1g.12gb", 1), ("2g.24gb", 2), ("3g.47gb", 4)],
        ),
        (H100_NVL, "1g.24gb=4", [("1g.24gb", 0), ("1g.24gb", 2), ("1g.24gb", 4), ("1g.24gb", 6)]),
    ],
)
def test_valid_layouts_come_with_the_hand_checked_witness(gpu: str, layout: str, witness: list) -> None:
    result = check(gpu, layout)
    assert result.ok, result.errors
    assert result.errors == []
    assert starts(result) == witness


def test_exact_models_carry_no_placement_warning() -> None:
    for gpu in (H100, A100_80, H100_NVL, A30):
        assert not [w for w in check(gpu, "").warnings if "inferred" in w]


# --- invalid layouts: each error names the GPU, the profile and the reason ----------------------------------


def test_pinned_starts_that_overlap() -> None:
    error = assert_invalid(check(H100, "4g.40gb@0,3g.40gb@0"), "4g.40gb@0", "3g.40gb@0", "overlaps")
    assert error == "4g.40gb@0 overlaps 3g.40gb@0 (memory slices 0-3) on NVIDIA H100 80GB HBM3"
    # The multiset form of the same instances is valid: 3g.40gb may start at 4 instead.
    assert check(H100, "4g.40gb=1,3g.40gb=1").ok


def test_pinned_start_that_the_profile_does_not_allow() -> None:
    error = assert_invalid(check(H100, "3g.40gb@2"), "3g.40gb@2")
    assert error == "3g.40gb@2: start 2 is not an allowed placement on NVIDIA H100 80GB HBM3 (allowed: 0, 4)"
    assert_invalid(check(H100, "1g.10gb@7"), "1g.10gb@7", "allowed: 0, 1, 2, 3, 4, 5, 6")


def test_free_instances_that_do_not_fit_around_pinned_ones() -> None:
    error = assert_invalid(check(H100, "3g.40gb@0,4g.40gb"), "4g.40gb", "3g.40gb@0", "no placement")
    assert "free memory slices are 4-7" in error and "4g.40gb (4 slices) only starts at 0" in error
    assert_invalid(check(H100, "3g.40gb@0,2g.20gb=2"), "2g.20gb x2", "starts at 0, 2 or 4")


def test_fragmentation_where_the_slices_add_up() -> None:
    # 2g.20gb x3 take slices 0-5; 1g.10gb can use 6 but never 7. 8 of 8 slices, yet no placement;
    # and 3 x 2 + 2 x 1 = 8 compute slices of 7 besides.
    result = check(H100, "2g.20gb=3,1g.10gb=2")
    assert_invalid(result, "8 compute slices", "2g.20gb 6", "1g.10gb 2", "has 7")
    placement = assert_invalid(result, "no placement exists", "1g.10gb x2, 2g.20gb x3")
    assert "needs 8 of 8 memory slices" in placement and "starts at 0, 2 or 4" in placement


def test_memory_slices_beyond_the_gpu_even_though_compute_fits() -> None:
    # On A100-40GB 1g.10gb takes 2 memory slices: four of them fill all 8; 5 compute slices of 7 would fit.
    error = assert_invalid(
        check(A100_40, "1g.10gb=4,1g.5gb=1"), "1g.10gb x4", "1g.5gb", "needs 9 of 8 memory slices"
    )
    assert "compute" not in error
    assert_invalid(check(A100_80, "3g.40gb=2,1g.10gb=1"), "needs 9 of 8 memory slices")


def test_more_instances_of_a_profile_than_it_allows() -> None:
    error = assert_invalid(check(H100, "1g.10gb+me=2"), "1g.10gb+me", "at most 1")
    assert error.startswith("1g.10gb+me: 2 instances requested")
    assert_invalid(check(A100_40, "1g.10gb=5"), "1g.10gb", "at most 4")
    assert_invalid(check(A100_80, "1g.10gb=8"), "1g.10gb", "at most 7")


def test_same_profile_name_different_geometry() -> None:
    assert check(A100_80, "1g.10gb=7").ok
    assert check(H100, "1g.10gb=7").ok
    assert_invalid(check(A100_40, "1g.10gb=7"), "1g.10gb", "at most 4")
    assert check(A100_40, "1g.10gb=4").ok


def test_compute_slices_beyond_the_gpu() -> None:
    assert_invalid(check(H100, "4g.40gb,2g.20gb=2"), "8 compute slices", "4g.40gb 4", "2g.20gb 4")
    assert_invalid(check(A30, "2g.12gb,1g.6gb=3"), "5 compute slices", "has 4")


def test_driver_minimums_are_errors_with_a_branch_and_warnings_without() -> None:
    old = check(A100_40, "1g.10gb=4", driver_branch=470)
    assert old.errors == ["1g.10gb needs driver R525 or newer on NVIDIA A100-SXM4-40GB; the host runs R470"]
    assert check(A100_40, "1g.10gb=4", driver_branch=525).ok
    unknown = check(A100_40, "1g.10gb=4")
    assert unknown.ok
    assert any("1g.10gb needs driver R525" in w and A100_40 in w for w in unknown.warnings)
    assert_invalid(check(A100_40, "1g.5gb+me", driver_branch=450), "1g.5gb+me", "R470", "R450")
    assert_invalid(check(A100_80, "1g.20gb", driver_branch=470), "1g.20gb", "R525")
    assert_invalid(check("NVIDIA A100 80GB PCIe", "1g.20gb", driver_branch=470), "1g.20gb", "R525")
    assert_invalid(check(A30, "2g.12gb+me", driver_branch=470), "2g.12gb+me", "R525")
    assert check(A30, "2g.12gb+me", driver_branch=535).ok


def test_combination_rule_applies_only_to_the_pair() -> None:
    assert_invalid(
        check(A100_40, "4g.20gb,3g.20gb", driver_branch=470), "4g.20gb together with 3g.20gb", "R510"
    )
    assert check(A100_40, "4g.20gb,3g.20gb", driver_branch=510).ok
    assert check(A100_40, "4g.20gb", driver_branch=470).ok
    assert check(A100_40, "3g.20gb=2", driver_branch=470).ok
    warned = check(A100_40, "4g.20gb,3g.20gb")
    assert warned.ok and any("R510" in w for w in warned.warnings)


def test_media_engines_shared_by_plus_me_profiles() -> None:
    # A30 has one JPEG decoder and one OFA; each +me profile takes both.
    result = check(A30, "1g.6gb+me,2g.12gb+me")
    error = assert_invalid(result, "media engines", "jpeg 2 of 1", "1g.6gb+me 1", "2g.12gb+me 1")
    assert "ofa 2 of 1" in error
    assert any("inferred from its full-GPU profile 4g.24gb" in w for w in result.warnings)
    # Geometry alone would place them (slice 0, slices 2-3), so the engines are the whole reason.
    assert len(result.errors) == 1
    rtx = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert_invalid(check(rtx, "1g.24gb+me.all,1g.24gb"), "nvdec 5 of 4")
    assert check(rtx, "1g.24gb+me.all,1g.24gb-me=3").ok


def test_inferred_placements_are_always_flagged() -> None:
    for gpu, layout in [
        ("NVIDIA B200", "1g.23gb=7"),
        ("NVIDIA H100 PCIe", "3g.40gb=2"),
        ("NVIDIA B200", "7g.180gb=2"),
    ]:
        result = check(gpu, layout)
        flagged = [w for w in result.warnings if "inferred from a sibling GPU" in w and gpu in w]
        assert flagged and "placement_confidence: inferred" in flagged[0]
    assert check("NVIDIA B200", "1g.23gb=7").ok
    assert not check("NVIDIA B200", "7g.180gb=2").ok
    # The H200's placements were confirmed on a real GPU (driver 580.159.04): no longer flagged.
    assert not [w for w in check("NVIDIA H200", "1g.18gb=7").warnings if "inferred" in w]


def test_gpu_without_mig_is_rejected_clearly() -> None:
    error = assert_invalid(check("NVIDIA L4", "1g.10gb"), "does not support MIG", "1g.10gb=1")
    assert "time-slicing or MPS" in error
    assert_invalid(check("Tesla T4", ""), "does not support MIG")


def test_profiles_of_another_model_are_named_with_this_models_list() -> None:
    error = assert_invalid(check(A100_40, "1g.20gb"), "1g.20gb is not a MIG profile")
    assert "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb" in error
    assert_invalid(check(H100, "1g.10gb.me"), "did you mean 1g.10gb+me?")


def test_input_order_does_not_change_the_verdict() -> None:
    first = check(H100, "3g.40gb@0,4g.40gb@0")
    second = check(H100, "4g.40gb@0,3g.40gb@0")
    assert first == second
    assert check(A100_40, "1g.5gb,3g.20gb,2g.10gb") == check(A100_40, "2g.10gb,1g.5gb,3g.20gb")


def test_results_are_independent_copies() -> None:
    result = check(H100, "1g.10gb+me=2")
    result.errors.append("changed by a caller")
    result.warnings.append("changed by a caller")
    result.placements.append(Placement("7g.80gb", 0, 8))
    again = check(H100, "1g.10gb+me=2")
    assert "changed by a caller" not in again.errors + again.warnings
    assert again.placements == []


def test_json_form() -> None:
    result = check(H100, "4g.40gb,3g.40gb")
    assert result.as_json() == {
        "ok": True,
        "gpu": H100,
        "errors": [],
        "warnings": [],
        "placements": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
    }


def test_a_model_built_by_hand_does_not_share_the_catalog_models_cache() -> None:
    real = model(H100)
    fields = {f: getattr(real, f) for f in GpuModel.__dataclass_fields__}
    fields["placement_confidence"] = "inferred"
    copy = GpuModel(**fields)
    assert not [w for w in check_layout(real, parse_layout("7g.80gb")).warnings if "inferred" in w]
    assert [w for w in check_layout(copy, parse_layout("7g.80gb")).warnings if "inferred" in w]


# --- layout syntax ----------------------------------------------------------------------------------------


def test_parse_counts_starts_and_bare_names() -> None:
    assert parse_layout("1g.10gb=2, 3g.40gb@4 ,2g.20gb") == (
        Instance("1g.10gb"),
        Instance("1g.10gb"),
        Instance("3g.40gb", 4),
        Instance("2g.20gb"),
    )
    assert parse_layout(" 1g.10gb + me = 1") == (Instance("1g.10gb+me"),)
    assert parse_layout("") == ()
    assert parse_layout("   ") == ()
    assert parse_layout("1g.24gb-me=2,1g.24gb+me.all") == (
        Instance("1g.24gb-me"),
        Instance("1g.24gb-me"),
        Instance("1g.24gb+me.all"),
    )


@pytest.mark.parametrize(
    ("text", "named", "reason"),
    [
        ("1g.10gb=0", "1g.10gb=0", "below 1"),
        ("1g.10gb=-2", "1g.10gb=-2", "below 1"),
        ("1g.10gb=two", "1g.10gb=two", "not a whole number"),
        ("3g.40gb@-4", "3g.40gb@-4", "negative"),
        ("3g.40gb@x", "3g.40gb@x", "not a whole number"),
        ("1g.10gb=2@3", "1g.10gb=2@3", "not a profile name"),
        ("1g.10gb,,2g.20gb", "''", "empty item"),
        ("1g.10gb,", "''", "empty item"),
        ("=2", "=2", "not a profile name"),
    ],
)
def test_bad_layout_text_is_unusable_input(text: str, named: str, reason: str) -> None:
    with pytest.raises(GpushareError) as caught:
        parse_layout(text)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert named in message and reason in message
    assert "PROFILE=COUNT" in message and "PROFILE@START" in message


def test_counts_and_back() -> None:
    layout = layout_from_counts({"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 0})
    assert layout_counts(layout) == {"1g.10gb": 2, "3g.40gb": 1}
    assert format_layout(layout + (Instance("4g.40gb", 0),)) == "1g.10gb=2,3g.40gb=1,4g.40gb@0"
    assert parse_layout(format_layout(layout)) == layout
    with pytest.raises(GpushareError):
        layout_from_counts({"1g.10gb": -1})
    with pytest.raises(GpushareError):
        layout_from_counts({"1g.10gb": True})


# --- NVIDIA's shipped named configs all pass --------------------------------------------------------------


def _config_cases() -> list[Any]:
    configs = yaml.safe_load(DEFAULT_CONFIGS.read_text())["mig-configs"]
    catalog = load_catalog()
    mig_models = [m for m in catalog.models.values() if m.mig_capable]
    cases = []
    for name, entries in configs.items():
        for entry in entries:
            if not entry.get("mig-enabled"):
                continue
            devices = entry.get("mig-devices") or {}
            device_filter = entry.get("device-filter")
            if device_filter is None:
                targets = [m for m in mig_models if set(devices) <= set(m.profiles)]
            else:
                ids = [device_filter] if isinstance(device_filter, str) else device_filter
                found = [catalog.find(pci) for pci in ids]
                targets = list({m.name: m for m in found if m is not None}.values())
            cases += [pytest.param(m.name, devices, id=f"{name}-{m.slug}") for m in targets]
    return cases


CONFIG_CASES = _config_cases()


def test_config_cases_cover_the_catalog() -> None:
    ids = {case.id for case in CONFIG_CASES}
    assert len(CONFIG_CASES) > 80
    for expected in (
        "all-balanced-a30",
        "all-balanced-a100-sxm4-40gb",
        "all-1g.10gb-a100-sxm4-40gb",
        "all-1g.10gb-h100-80gb-hbm3",
        "all-1g.24gb-rtx-pro-6000-blackwell-server-edition",
        "all-enabled-h200",
        "all-balanced-gh200-480gb",
        "all-1g.35gb-h200",
    ):
        assert expected in ids


@pytest.mark.parametrize(("gpu", "devices"), CONFIG_CASES)
def test_nvidia_default_config_passes(gpu: str, devices: dict[str, int]) -> None:
    layout = layout_from_counts(devices)
    result = check_layout(model(gpu), layout)
    assert result.ok, result.errors
    assert sorted(p.profile for p in result.placements) == sorted(i.profile for i in layout)
