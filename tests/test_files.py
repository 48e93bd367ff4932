"""gpushare.files: the one loader (regular UTF-8 files only, YAML without surprises, bounded numbers) and the
atomic writers (a file renamed over its target, a directory exchanged with its target in one step), including a
writer killed with SIGKILL at random moments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpushare.cli import main
from gpushare.core import files
from gpushare.core.errors import GpushareError
from tests.conftest import ROOT


def _error(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(GpushareError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize(("text", "expected"), [
    ("no", "no"), ("yes", "yes"), ("on", "on"), ("off", "off"), ("y", "y"), ("Yes", "Yes"),
    ("2026-02-30", "2026-02-30"), ("2026-11-30", "2026-11-30"), ("1:30", "1:30"), ("0x1F", "0x1F"),
    ("010", 10), ("-4", -4), ("+7", 7), ("1.5", 1.5), ("1e3", 1000.0), ("true", True), ("False", False),
    ("null", None), ("~", None), ("'4'", "4"),
])
def test_scalars_read_as_yaml_1_2_core(text: str, expected: object) -> None:
    value = files.parse_yaml(f"k: {text}\n", "f.yaml")["k"]
    assert value == expected and type(value) is type(expected)


def test_long_numbers_are_refused_before_conversion() -> None:
    assert "longer than 18 digits" in _error(files.parse_yaml, "a: " + "9" * 5000, "f.yaml")
    assert files.parse_yaml("a: " + "9" * 18, "f.yaml")["a"] == int("9" * 18)
    assert files.parse_yaml("a: '" + "9" * 50 + "'", "f.yaml")["a"] == "9" * 50


def test_duplicate_keys_and_bad_syntax_are_located() -> None:
    assert "f.yaml:2: key 'a' appears twice" in _error(files.parse_yaml, "a: 1\na: 2\n", "f.yaml")
    assert "not valid YAML" in _error(files.parse_yaml, "a: [1\n", "f.yaml")
    assert "not valid YAML" in _error(files.parse_yaml, "a: !!python/object:os.system ['id']\n", "f.yaml")



@pytest.mark.parametrize(("text", "line", "kind"), [
    ("name: dev\n? [a, b]\n: 1\n", 2, "list"),
    ("name: dev\n? {a: 1}\n: x\n", 2, "mapping"),
    ("name: dev\npools:\n  - ? [x]\n    : 1\n", 3, "list"),
    ("name: dev\n[a]: 1\n", 2, "list"),
])
def test_a_complex_key_is_a_located_error(text: str, line: int, kind: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert f"f.yaml:{line}: a mapping key is a {kind}" in _error(files.parse_yaml, text, "f.yaml")
    # Through the CLI's boundary: exit 1 with the file and line, not an internal error (70).
    path = tmp_path / "dev.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--env", str(path), "--json"])
    assert exit_.value.code == 1
    (problem,) = json.loads(capsys.readouterr().out)["problems"]
    assert (problem["file"], problem["line"]) == (str(path), line) and problem["fix"]
    assert files.parse_yaml("? plain\n: 1\n", "f.yaml") == {"plain": 1}  # an explicit plain key stays fine

def test_only_regular_utf8_files_within_the_limit_are_read(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "latin1.yaml").write_bytes(b"a: 1\nb: caf\xe9\n")
    (tmp_path / "big.yaml").write_bytes(b"#" * (files.MAX_BYTES + 1))
    assert "is a directory" in _error(files.read_text, tmp_path / "d")
    assert "FIFO" in _error(files.read_text, tmp_path / "fifo")  # refused without opening: nothing blocks
    assert "not a regular file" in _error(files.read_text, Path("/dev/null"))
    assert "not found" in _error(files.read_text, tmp_path / "missing.yaml")
    assert "latin1.yaml:2: not UTF-8: byte 0xe9 at offset 11" in _error(files.read_text, tmp_path / "latin1.yaml")
    assert "above the limit" in _error(files.read_text, tmp_path / "big.yaml")
    for bad in ("d", "fifo", "missing.yaml", "latin1.yaml", "big.yaml"):
        with pytest.raises(GpushareError) as info:
            files.read_text(tmp_path / bad)
        assert info.value.exit_code == 2 and all(p.fix for p in info.value.problems)


def test_output_paths_are_checked_before_work(tmp_path: Path) -> None:
    env = tmp_path / "environments" / "dev.yaml"
    env.parent.mkdir()
    env.write_text("name: dev\n")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (tmp_path / "file").write_text("x")
    inputs = [env, profiles]
    assert "existing file" in _error(files.check_output_dir, tmp_path / "file", inputs)
    assert "would replace input" in _error(files.check_output_dir, tmp_path, inputs)
    assert "would replace input" in _error(files.check_output_dir, tmp_path / "environments", inputs)
    assert "inside the input directory" in _error(files.check_output_dir, profiles / "out", inputs)
    assert "would replace input" in _error(files.check_output_file, env, inputs)
    assert "names a directory" in _error(files.check_output_file, profiles, inputs)
    files.check_output_dir(tmp_path / "build" / "dev", inputs)
    files.check_output_file(tmp_path / "build" / "dev.patch", inputs)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "not writable" in _error(files.check_output_file, locked / "x.patch", inputs)


def test_write_file_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.patch"
    files.write_file(target, "one\n")
    target.chmod(0o600)
    files.write_file(target, "two\n")
    assert target.read_text() == "two\n" and (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["out.patch"]  # no temporary file left

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        files.write_with(target, broken)
    assert target.read_text() == "two\n" and [p.name for p in target.parent.iterdir()] == ["out.patch"]


def _fill(content: str):  # type: ignore[no-untyped-def]
    def fill(tmp: Path) -> None:
        for i in range(3):
            (tmp / f"f{i}").write_text(content)
    return fill


def test_replace_dir_swaps_in_one_step_and_a_failure_keeps_the_old(tmp_path: Path) -> None:
    out = tmp_path / "out"
    files.replace_dir(_fill("old"), out)
    files.replace_dir(_fill("new"), out)
    assert {p.read_text() for p in out.iterdir()} == {"new"}

    def broken(tmp: Path) -> None:
        (tmp / "f0").write_text("partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.replace_dir(broken, out)
    assert {p.read_text() for p in out.iterdir()} == {"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_fallback_swap_leftover_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2 cannot exchange, the old tree is renamed aside first; an interruption between the two
    renames leaves it there, and the next write (or read of the target) puts things right."""
    out = tmp_path / "out"
    files.replace_dir(_fill("old"), out)
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    real_rename = Path.rename
    calls = []

    def rename_then_die(self: Path, target: Path) -> Path:
        calls.append(self)
        if len(calls) == 2:
            raise KeyboardInterrupt  # between moving the old tree aside and moving the new one in
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        files.replace_dir(_fill("new"), out)
    monkeypatch.setattr(Path, "rename", real_rename)
    assert {p.read_text() for p in out.iterdir()} == {"old"}  # restored on the way out
    files.replace_dir(_fill("new"), out)
    assert {p.read_text() for p in out.iterdir()} == {"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_interrupted_fallback_without_cleanup_is_completed_next_time(tmp_path: Path) -> None:
    out = tmp_path / "out"
    aside = tmp_path / ".out.gpushare-old"
    aside.mkdir()
    (aside / "f0").write_text("old")  # as SIGKILL between the two renames would leave it
    files.complete_swap(out)
    assert (out / "f0").read_text() == "old" and not aside.exists()


@pytest.mark.slow
def test_render_killed_at_any_moment_leaves_the_whole_old_or_the_whole_new(tmp_path: Path) -> None:
    """SIGKILL a process that keeps rewriting a directory of many files; after every kill the directory holds
    one version completely."""
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import sys, itertools
        from pathlib import Path
        from gpushare.core.files import replace_dir
        out = Path({str(out)!r})
        def fill(version):
            def go(tmp):
                for i in range(200):
                    (tmp / f"f{{i:03d}}").write_text(version * 50)
            return go
        for n in itertools.count():
            replace_dir(fill(str(n % 10)), out)
            if n == 0:
                print("ready", flush=True)
    """)
    seen = set()
    for attempt in range(25):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.01 + (attempt % 7) * 0.013)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        files.complete_swap(out)
        contents = {p.read_text() for p in out.iterdir()}
        assert len(list(out.iterdir())) == 200 and len(contents) == 1, (attempt, len(list(out.iterdir())))
        seen |= contents
    assert len(seen) > 1  # the kills landed in different versions
