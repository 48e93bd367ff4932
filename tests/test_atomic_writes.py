"""Every output is replaced whole or not at all: on a signal (SIGTERM is handled like Ctrl-C, so cleanup runs), on a
full disk (a real write limit, RLIMIT_FSIZE, in a subprocess), and between the two folders of a preview, which
never hold two runs' output mixed. Temporary files are removed in every case."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpushare.core import files
from gpushare.core.errors import GpushareError

ROOT = Path(__file__).resolve().parents[1]


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def _fill(text: str) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        (tmp / "a.yaml").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.yaml").write_text(text)

    return fill


@pytest.fixture
def two_parts(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "out" / "manifests", tmp_path / "out" / "helm-values"
    files.replace_dirs({one: _fill("old"), two: _fill("old")})
    return one, two


def test_both_parts_are_replaced_together(two_parts: tuple[Path, Path]) -> None:
    one, two = two_parts
    files.replace_dirs({one: _fill("new"), two: _fill("new")})
    assert set(_tree(one).values()) == set(_tree(two).values()) == {"new"}
    assert sorted(p.name for p in one.parent.iterdir()) == ["helm-values", "manifests"]


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "rename-aside"])
def test_an_interruption_between_the_two_parts_leaves_the_old_preview(two_parts: tuple[Path, Path],
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      fallback: bool) -> None:
    one, two = two_parts
    real = files._exchange
    calls: list[Path] = []

    def exchange(a: Path, b: Path) -> bool:
        calls.append(b)
        if len(calls) == 2:  # the second part's swap: a signal arrives
            raise KeyboardInterrupt
        return False if fallback else real(a, b)

    monkeypatch.setattr(files, "_exchange", exchange)
    with pytest.raises(KeyboardInterrupt):
        files.replace_dirs({one: _fill("new"), two: _fill("new")})
    monkeypatch.setattr(files, "_exchange", real)
    assert set(_tree(one).values()) == set(_tree(two).values()) == {"old"}
    assert sorted(p.name for p in one.parent.iterdir()) == ["helm-values", "manifests"]  # nothing left over


def test_a_full_disk_while_filling_is_an_error_and_leaves_the_old_output(two_parts: tuple[Path, Path]) -> None:
    one, two = two_parts

    def full(tmp: Path) -> None:
        (tmp / "a.yaml").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(GpushareError) as err:
        files.replace_dirs({one: _fill("new"), two: full})
    assert err.value.exit_code == 2 and "No space left on device" in str(err.value)
    assert set(_tree(one).values()) == set(_tree(two).values()) == {"old"}
    assert sorted(p.name for p in one.parent.iterdir()) == ["helm-values", "manifests"]


@pytest.fixture
def sigterm_as_interrupt() -> Iterator[None]:
    from gpushare.cli import _terminate_as_interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for sig in before:
        signal.signal(sig, signal.SIG_DFL)
    _terminate_as_interrupt()
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_sigterm_while_writing_removes_the_temporary_files(tmp_path: Path, sigterm_as_interrupt: None) -> None:
    target = tmp_path / "build"
    files.replace_dir(_fill("old"), target)

    def killed(tmp: Path) -> None:
        (tmp / "a.yaml").write_text("new")
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        files.replace_dir(killed, target)
    assert set(_tree(target).values()) == {"old"} and [p.name for p in tmp_path.iterdir()] == ["build"]
    def killed_file(tmp: Path) -> None:
        tmp.write_text("new")
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        files.write_with(target / "a.yaml", killed_file)
    assert set(_tree(target).values()) == {"old"} and sorted(p.name for p in target.iterdir()) == ["a.yaml", "sub"]


def test_sigterm_during_the_swap_waits_until_it_is_whole(two_parts: tuple[Path, Path], sigterm_as_interrupt: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with another thread running (as the preview's Pulumi threads do), which the kernel may hand the signal
    to: a thread's signal mask would not hold it."""
    import threading

    one, two = two_parts
    real = files._exchange
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()

    def exchange(a: Path, b: Path) -> bool:
        os.kill(os.getpid(), signal.SIGTERM)  # held until both parts are in place
        return real(a, b)

    monkeypatch.setattr(files, "_exchange", exchange)
    try:
        with pytest.raises(KeyboardInterrupt):
            files.replace_dirs({one: _fill("new"), two: _fill("new")})
    finally:
        stop.set()
    assert set(_tree(one).values()) == set(_tree(two).values()) == {"new"}
    assert sorted(p.name for p in one.parent.iterdir()) == ["helm-values", "manifests"]


def _limited(args: list[str], limit: int | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    """gpushare with a real file-size limit: a write past it fails with EFBIG, as on a full disk."""
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "gpushare", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GPUSHARE_ROOT": str(ROOT)}, preexec_fn=preexec, timeout=300)


@pytest.mark.slow  # two gpushare processes each
@pytest.mark.parametrize("command", [["render", "--env", "dev", "--out"],
                                     ["pack", "--demand", "examples/demand/inference.yaml", "--env-out"]],
                         ids=["render --out", "pack --env-out"])
def test_a_write_that_fails_midway_leaves_the_old_output_whole(tmp_path: Path, command: list[str]) -> None:
    out = tmp_path / ("build" if command[0] == "render" else "env.yaml")
    first = _limited([*command, str(out)], None, ROOT)
    assert first.returncode == 0, first.stderr
    before = _tree(out) if out.is_dir() else {"": out.read_text()}
    failed = _limited([*command, str(out)], 512, ROOT)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "cannot write" in failed.stderr and "fix" in failed.stderr, failed.stderr
    assert (_tree(out) if out.is_dir() else {"": out.read_text()}) == before
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file or folder left


@pytest.mark.slow
def test_preview_on_a_full_disk_leaves_the_old_preview_whole(tmp_path: Path) -> None:
    out = tmp_path / "preview"
    first = _limited(["preview", "--env", "dev", "--out", str(out)], None, ROOT)
    assert first.returncode == 0, first.stderr
    before = _tree(out)
    failed = _limited(["preview", "--env", "dev", "--out", str(out)], 2048, ROOT)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "cannot write" in failed.stderr, failed.stderr
    assert _tree(out) == before and [p.name for p in tmp_path.iterdir()] == ["preview"]
