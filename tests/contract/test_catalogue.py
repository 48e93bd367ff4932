"""Every catalogued kind of bad input gets its exit code, its message and a fix, changes nothing outside the
output path, and docs/bad-input.md shows exactly what gpushare answered."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.catalogue import CASES, DOC, Case, render_doc, run_case
from tests.contract.harness import Result, Worker, assert_contract, make_workspace, snapshot

_ANSWERS: dict[str, tuple[Case, Result]] = {}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(make_workspace(tmp_path_factory.mktemp("catalogue-ws")))
    yield w
    w.close()


@pytest.mark.parametrize("case", CASES, ids=[c.input for c in CASES])
def test_bad_input_gets_its_answer(worker: Worker, case: Case) -> None:
    before = snapshot(worker.workspace)
    result = run_case(worker, case)
    assert_contract(result, case.args, before, snapshot(worker.workspace))
    assert result.code == case.code, result.text
    for text in case.contains:
        assert text in result.text, (text, result.text)
    _ANSWERS[case.input] = (case, result)


def test_catalogue_page_is_current(worker: Worker) -> None:
    rows = [_ANSWERS.get(c.input) or (c, run_case(worker, c)) for c in CASES]
    text = render_doc(rows)
    if os.environ.get("GPUSHARE_WRITE_CATALOGUE"):
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(text)
    current = DOC.read_text() if DOC.exists() else ""
    assert current == text, (f"{Path(DOC).name} is stale: GPUSHARE_WRITE_CATALOGUE=1 .venv/bin/pytest "
                             "tests/contract/test_catalogue.py")
