"""A large cluster dump is read item by item: the YAML node tree of the whole file (a Python object and two marks per
value, about 20 bytes of memory per byte of dump: a 50 MB dump took 1.1 GiB) is never held at once. What it reads is
exactly what whole-document loading reads, with the same errors, and the bound on aliases holds across items.
Memory is compared to the dump's size with tracemalloc, not timed; the figures for a 50 MB dump are
benchmarks/import_memory.py's."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import yaml

from gpushare.core import files
from gpushare.core.errors import GpushareError
from tests.brownfield.conftest import CLUSTERS


def _dump(count: int) -> str:
    items = [{"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": f"gpu-{i:05d}", "labels": {f"feature.node.kubernetes.io/cpu-cpuid.F{k}": "true" for k in range(40)},
        "managedFields": [{"manager": "gfd", "time": "2026-12-01T10:00:00Z",
                           "fieldsV1": {"f:metadata": {"f:labels": {f"f:x{k}": {} for k in range(40)}}}}]},
        "status": {"images": [{"names": [f"nvcr.io/image-{k}:v1"], "sizeBytes": 1000 + k} for k in range(20)]}}
        for i in range(count)]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})


def test_a_dump_is_read_in_a_few_times_its_size() -> None:
    text = _dump(300)  # about 2 MB
    tracemalloc.start()
    try:
        documents = files.parse_yaml_documents(text, "nodes.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(documents[0]["items"]) == 300
    # Under tracemalloc, whole-document composition peaked at 34 times the text here; item by item at 6.4 times
    # (the result itself and one item's tree).
    assert peak < 10 * len(text), f"peak {peak / 2**20:.1f} MiB for {len(text) / 2**20:.1f} MiB of dump"


@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_item_by_item_reads_what_whole_documents_read(path: Path) -> None:
    text = path.read_text()
    whole = [d for d in yaml.load_all(text, Loader=files.StrictLoader) if d is not None]  # noqa: S506 - safe
    assert files.parse_yaml_documents(text, str(path)) == whole


def test_anchors_and_aliases_across_items_read_as_before() -> None:
    text = "kind: List\nitems:\n- &a {x: [1, 2]}\n- *a\n- {y: *a}\n---\nkind: List\nitems: &b [1]\nother: *b\n"
    assert files.parse_yaml_documents(text, "t") == [
        {"kind": "List", "items": [{"x": [1, 2]}, {"x": [1, 2]}, {"y": {"x": [1, 2]}}]},
        {"kind": "List", "items": [1], "other": [1]}]


@pytest.mark.parametrize(("text", "said"), [
    ("kind: List\nitems:\n- {a: 1}\n- {a: 1, a: 2}\n", "dump.yaml:4: key 'a' appears twice"),
    ("kind: List\nitems:\n- a: 1\n- b: [\n", "dump.yaml:5: not valid YAML"),
    ("kind: List\nitems:\n- {n: " + "1" * 30 + "}\n", "dump.yaml:3: number 111111111111...(30 digits)"),
    ("kind: List\nitems:\n- {<<: {a: 1}}\n", "dump.yaml:3: a YAML merge key"),
])
def test_errors_inside_an_item_keep_their_line(text: str, said: str) -> None:
    with pytest.raises(GpushareError) as err:
        files.parse_yaml_documents(text, "dump.yaml")
    assert said in str(err.value), str(err.value)


def test_the_alias_bound_counts_every_item() -> None:
    """Each item alone expands to less than the bound; together they pass it."""
    laughs = "x: &l0 [a, a, a, a, a, a, a, a, a, a]\n" + "".join(
        f"y{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 6))  # 10**6 values
    items = "".join(f"- {{n: {i}, v: *l5}}\n" for i in range(12))
    text = "kind: List\nanchors:\n" + "".join("  " + line + "\n" for line in laughs.splitlines()) + "items:\n" + items
    with pytest.raises(GpushareError) as err:
        files.parse_yaml_documents(text, "dump.yaml")
    assert "expand to more than 10,000,000 values" in str(err.value), str(err.value)
    fewer = text.split("items:\n")[0] + "items:\n" + "".join(items.splitlines(keepends=True)[:7])
    assert len(files.parse_yaml_documents(fewer, "dump.yaml")[0]["items"]) == 7
