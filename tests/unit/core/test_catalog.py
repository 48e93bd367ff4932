"""The GPU catalog: data copied faithfully, additions sourced, lookup by every name a user may type."""

from __future__ import annotations

import re

import pytest
import yaml

from gpushare.core.catalog import (
    Catalog,
    GpuModel,
    build_catalog,
    load_catalog,
    normalise_pci_id,
    slug_of,
)
from gpushare.core.errors import GpushareError
from tests.conftest import ROOT

DATA = ROOT / "gpushare" / "data"
SHARED_PROFILES = ROOT.parent / "shared" / "data" / "nvidia" / "mig_profiles.yaml"
RAW = yaml.safe_load((DATA / "mig_profiles.yaml").read_text())
EXTRA = yaml.safe_load((DATA / "catalog_extra.yaml").read_text())
NON_MIG = ["Tesla T4", "NVIDIA A10", "NVIDIA L4", "NVIDIA L40S", "NVIDIA RTX 6000 Ada Generation"]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_package_copy_is_the_shared_file_plus_one_source_line() -> None:
    if not SHARED_PROFILES.exists():
        pytest.skip("shared/ is not beside this checkout")
    first, rest = (DATA / "mig_profiles.yaml").read_bytes().split(b"\n", 1)
    assert first == b"# Copied from shared/data/nvidia/mig_profiles.yaml; sources per GPU below."
    assert rest == SHARED_PROFILES.read_bytes()


def test_every_mig_model_of_the_data_file_is_in_the_catalog_with_its_geometry(catalog: Catalog) -> None:
    for name, raw in RAW.items():
        model = catalog.models[name]
        assert model.mig_capable
        assert model.compute_slices_total == raw["compute_slices_total"]
        assert model.placement_units_total == raw["placement_units_total"]
        assert list(model.profiles) == [p["name"] for p in raw["profiles"]]
        for p in raw["profiles"]:
            profile = model.profiles[p["name"]]
            assert (profile.id, profile.compute_slices, profile.memory_slices, profile.max_count) == (
                p["id"],
                p["compute_slices"],
                p["memory_slices"],
                p["max_count"],
            )
            assert profile.placements == tuple(p["placements"])
            assert profile.memory_gib == p["memory_gib"]
        assert model.confidence == raw["confidence"]
        assert model.placement_confidence == raw["placement_confidence"]
        assert model.placements_exact == (raw["placement_confidence"] == "exact")


def test_non_mig_models_are_listed_without_profiles(catalog: Catalog) -> None:
    for name in NON_MIG:
        model = catalog.models[name]
        assert not model.mig_capable
        assert model.profiles == {}
        assert (model.compute_slices_total, model.placement_units_total) == (0, 0)
    assert catalog.models["Tesla T4"].memory_gib == 16
    assert catalog.models["NVIDIA L40S"].pci_device_ids == ("0x26B910DE",)


def test_slugs_are_unique_dns_labels(catalog: Catalog) -> None:
    slugs = [m.slug for m in catalog.models.values()]
    assert len(set(slugs)) == len(slugs)
    for slug in slugs:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", slug), slug
    assert catalog.models["NVIDIA H100 80GB HBM3"].slug == "h100-80gb-hbm3"
    assert catalog.models["NVIDIA A100-SXM4-80GB"].slug == "a100-sxm4-80gb"
    assert catalog.models["NVIDIA L4"].slug == "l4"
    assert slug_of("NVIDIA A100 80GB PCIe") == "a100-80gb-pcie"


def test_one_profile_name_has_different_geometry_on_different_models(catalog: Catalog) -> None:
    small = catalog.models["NVIDIA A100-SXM4-40GB"].profile("1g.10gb")
    large = catalog.models["NVIDIA A100-SXM4-80GB"].profile("1g.10gb")
    hopper = catalog.models["NVIDIA H100 80GB HBM3"].profile("1g.10gb")
    assert (small.memory_slices, small.max_count, small.placements) == (2, 4, (0, 2, 4, 6))
    assert (large.memory_slices, large.max_count) == (1, 7)
    assert (hopper.memory_slices, hopper.max_count) == (1, 7)


def test_resource_suffix_follows_the_device_plugin(catalog: Catalog) -> None:
    h100 = catalog.models["NVIDIA H100 80GB HBM3"]
    assert h100.profile("1g.10gb+me").resource_suffix == "1g.10gb.me"
    assert h100.profile("3g.40gb").resource_suffix == "3g.40gb"
    rtx = catalog.models["NVIDIA RTX PRO 6000 Blackwell Server Edition"]
    assert rtx.profile("1g.24gb+me.all").resource_suffix == "1g.24gb.me.all"


def test_unknown_profile_names_the_gpu_and_lists_its_profiles(catalog: Catalog) -> None:
    with pytest.raises(GpushareError) as caught:
        catalog.models["NVIDIA A30"].profile("1g.10gb")
    message = str(caught.value)
    assert "1g.10gb" in message and "NVIDIA A30" in message
    assert "1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb" in message


def test_media_engine_totals_are_inferred_from_the_full_gpu_profile(catalog: Catalog) -> None:
    a30 = catalog.models["NVIDIA A30"]
    assert dict(a30.engine_totals) == {"nvdec": 4, "jpeg": 1, "ofa": 1}
    assert a30.engine_totals_inferred
    assert dict(catalog.models["NVIDIA H100 80GB HBM3"].engine_totals) == {"nvdec": 7, "jpeg": 7, "ofa": 1}
    rtx = catalog.models["NVIDIA RTX PRO 6000 Blackwell Server Edition"]
    assert dict(rtx.engine_totals) == {"nvdec": 4, "nvenc": 4, "jpeg": 4, "ofa": 1}
    # Copy engines are not a shared limit; B200 records only those, so it has no media totals.
    assert dict(catalog.models["NVIDIA B200"].engine_totals) == {}
    assert not catalog.models["NVIDIA B200"].engine_totals_inferred
    assert dict(catalog.models["NVIDIA A100-SXM4-80GB"].engine_totals) == {}
    assert catalog.models["NVIDIA H100 80GB HBM3"].profile("1g.10gb").engines == (
        ("ce", 1),
        ("nvdec", 1),
        ("jpeg", 1),
        ("ofa", 0),
    )


def test_driver_minimums_and_combination_rules(catalog: Catalog) -> None:
    a100_40 = catalog.models["NVIDIA A100-SXM4-40GB"]
    assert a100_40.profile("1g.5gb+me").min_driver_branch == 470
    assert a100_40.profile("1g.10gb").min_driver_branch == 525
    assert a100_40.profile("1g.5gb").min_driver_branch is None
    [rule] = a100_40.combination_rules
    assert rule.profiles == frozenset({"4g.20gb", "3g.20gb"}) and rule.min_driver_branch == 510
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"):
        assert catalog.models[name].profile("1g.20gb").min_driver_branch == 525
    assert catalog.models["NVIDIA A30"].profile("2g.12gb+me").min_driver_branch == 525
    assert catalog.models["NVIDIA H100 80GB HBM3"].profile("1g.20gb").min_driver_branch is None


def _quotes(source: str) -> list[str]:
    return re.findall(r'"([^"]+)"', source)


def test_every_driver_minimum_quotes_a_note_that_the_data_file_really_holds() -> None:
    notes = (DATA / "mig_profiles.yaml").read_text()
    sources = []
    for entry in EXTRA["mig_models"].values():
        for minimum in (entry or {}).get("driver_minimums") or ():
            sources.append(minimum["source"])
        for rule in (entry or {}).get("combination_rules") or ():
            sources.append(" ".join(rule["source"].split()))
    assert len(sources) == 6
    for source in sources:
        quoted = _quotes(source)
        assert quoted, source
        for text in quoted:
            assert text in " ".join(notes.split()), text


def test_every_addition_names_its_source() -> None:
    for name, entry in EXTRA["non_mig_models"].items():
        assert entry.get("source"), name
    for name, entry in EXTRA["mig_models"].items():
        for key in ("aliases", "extra_pci_device_ids", "gke_accelerator"):
            if (entry or {}).get(key):
                assert entry.get(f"{key}_source"), f"{name}: {key}"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("nvidia h100 80gb hbm3", "NVIDIA H100 80GB HBM3"),
        ("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3"),
        ("h100-80gb-hbm3", "NVIDIA H100 80GB HBM3"),
        ("nvidia-h100-80gb", "NVIDIA H100 80GB HBM3"),
        ("nvidia-h100-mega-80gb", "NVIDIA H100 80GB HBM3"),
        ("0x233010DE", "NVIDIA H100 80GB HBM3"),
        ("0x233010de", "NVIDIA H100 80GB HBM3"),
        ("0x2330", "NVIDIA H100 80GB HBM3"),
        ("2330", "NVIDIA H100 80GB HBM3"),
        ("10de:2330", "NVIDIA H100 80GB HBM3"),
        ("10DE:2330", "NVIDIA H100 80GB HBM3"),
        ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
        ("nvidia-tesla-a100", "NVIDIA A100-SXM4-40GB"),
        ("0x20F1", "NVIDIA A100-SXM4-40GB"),
        ("nvidia-a100-80gb", "NVIDIA A100-SXM4-80GB"),
        ("A30", "NVIDIA A30"),
        ("H200", "NVIDIA H200"),
        ("nvidia-h200-141gb", "NVIDIA H200"),
        ("nvidia-b200", "NVIDIA B200"),
        ("T4", "Tesla T4"),
        ("Tesla T4", "Tesla T4"),
        ("nvidia-tesla-t4", "Tesla T4"),
        ("0x1EB8", "Tesla T4"),
        ("L4", "NVIDIA L4"),
        ("nvidia-l4", "NVIDIA L4"),
        ("l40s", "NVIDIA L40S"),
        ("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation"),
        ("10de:26b1", "NVIDIA RTX 6000 Ada Generation"),
        ("A10", "NVIDIA A10"),
    ],
)
def test_lookup_by_every_name_form(catalog: Catalog, query: str, expected: str) -> None:
    assert catalog.lookup(query).name == expected


def test_gke_accelerators(catalog: Catalog) -> None:
    expected = {
        "Tesla T4": "nvidia-tesla-t4",
        "NVIDIA L4": "nvidia-l4",
        "NVIDIA A100-SXM4-40GB": "nvidia-tesla-a100",
        "NVIDIA A100-SXM4-80GB": "nvidia-a100-80gb",
        "NVIDIA H100 80GB HBM3": "nvidia-h100-80gb",
        "NVIDIA H200": "nvidia-h200-141gb",
        "NVIDIA B200": "nvidia-b200",
    }
    assert {m.name: m.gke_accelerator for m in catalog.models.values() if m.gke_accelerator} == expected


def test_unknown_gpu_is_unusable_input_and_suggests_close_names(catalog: Catalog) -> None:
    with pytest.raises(GpushareError) as caught:
        catalog.lookup("NVIDIA H100 80GB HBM")
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "'NVIDIA H100 80GB HBM'" in message
    assert "NVIDIA H100 80GB HBM3" in message
    with pytest.raises(GpushareError) as partial:
        catalog.lookup("A100")
    assert "NVIDIA A100-SXM4-40GB" in str(partial.value) and "NVIDIA A100-SXM4-80GB" in str(partial.value)
    with pytest.raises(GpushareError):
        catalog.lookup("0x9999")
    with pytest.raises(GpushareError):
        catalog.lookup("")


def test_pci_ids_are_normalised() -> None:
    assert normalise_pci_id("10de:20b0") == "0x20B010DE"
    assert normalise_pci_id(0x233010DE) == "0x233010DE"
    with pytest.raises(GpushareError):
        normalise_pci_id("not-a-pci-id")


def _model(name: str, **changes: object) -> GpuModel:
    base = load_catalog().models[name]
    fields = {f: getattr(base, f) for f in GpuModel.__dataclass_fields__}
    fields.update(changes)
    return GpuModel(**fields)


def test_a_name_that_would_mean_two_models_is_refused() -> None:
    first = _model("NVIDIA L4", aliases=("shared-name",))
    second = _model("NVIDIA A10", aliases=("shared-name",))
    with pytest.raises(ValueError, match="shared-name"):
        Catalog([first, second])


def test_additions_for_a_model_or_profile_the_data_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match="NVIDIA X1"):
        build_catalog(RAW, {"mig_models": {"NVIDIA X1": {}}})
    bad = {
        "mig_models": {"NVIDIA A30": {"driver_minimums": [{"profile": "9g.99gb", "min_driver_branch": 1}]}}
    }
    with pytest.raises(ValueError, match="9g.99gb"):
        build_catalog(RAW, bad)


def test_h200_memory_on_driver_580_is_what_the_real_gpu_reported() -> None:
    h200 = load_catalog().models["NVIDIA H200"]
    on_580 = {name: h200.profile_memory_gib(name, 580) for name in h200.profiles}
    assert on_580 == {"1g.18gb": 16.0, "1g.18gb+me": 16.0, "1g.35gb": 32.5, "2g.35gb": 32.5, "3g.71gb": 69.75,
                      "4g.71gb": 69.75, "7g.141gb": 140.0}
    # Another or an unknown driver gets the catalog's main value.
    assert h200.profile_memory_gib("3g.71gb", 550) == h200.profile_memory_gib("3g.71gb", None) == 69.5
    assert h200.profiles["7g.141gb"].memory_gib_values == (139.75, 140.0)


@pytest.mark.parametrize(("memory", "says"), [
    ({"3g.71gb": 70.0}, "neither memory_gib nor memory_gib_other_drivers"),
    ({"3g.80gb": 69.75}, "not a profile of NVIDIA H200"),
])
def test_driver_memory_must_be_a_value_the_geometry_file_lists(memory: dict[str, float], says: str) -> None:
    extra = yaml.safe_load((DATA / "catalog_extra.yaml").read_text())
    extra["mig_models"]["NVIDIA H200"]["memory_by_driver"] = [{"driver_branch": 580, "memory_gib": memory}]
    with pytest.raises(ValueError, match=says):
        build_catalog(RAW, extra)
