"""gpushare.core.files: the one loader (regular UTF-8 files only, YAML without surprises, bounded numbers) and the
atomic writers (a file renamed over its target, a directory exchanged with its target in one step), including a
writer killed with SIGKILL at random moments.

Every output is replaced whole or not at all: on a signal (SIGTERM is handled like Ctrl-C, so cleanup runs), on a
full disk (a real write limit, RLIMIT_FSIZE, in a subprocess), and between the two folders of a preview, which
never hold two runs' output mixed. Temporary files are removed in every case.

Aliases are bounded by what they expand to: a "billion laughs" document (here in a stack's gpushare:operatorValues)
is refused at once with its line, in well under the memory it would take; anchors and aliases of ordinary size still
read. A large cluster dump is read item by item: the YAML node tree of the whole file (a Python object and two marks
per value, about 20 bytes of memory per byte of dump: a 50 MB dump took 1.1 GiB) is never held at once. What it reads
is exactly what whole-document loading reads, with the same errors, and the bound on aliases holds across items.
Memory is compared to the dump's size with tracemalloc, not timed; the figures for a 50 MB dump are
benchmarks/import_memory.py's.

A workspace or output name longer than the file system takes (with room for the temporary name of an atomic write
beside it) is a located error before any work, not an internal error; a long name that fits still works.

yaml_text: the one form of the YAML gpushare writes for people, and every writer using it."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app, main
from gpushare.core import files
from gpushare.core.errors import GpushareError
from gpushare.core.files import YAML_WIDTH, yaml_text
from gpushare.core.reading import parse_yaml
from gpushare.core.stacks import stack_config
from tests.conftest import ROOT

CLUSTERS = ROOT / "tests" / "data" / "brownfield"  # kubectl dumps of running clusters


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

# ---------------------------------------------------------------- every output whole or not at all


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def _fill_parts(text: str) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        (tmp / "a.yaml").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.yaml").write_text(text)

    return fill


@pytest.fixture
def two_parts(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "out" / "manifests", tmp_path / "out" / "helm-values"
    files.replace_dirs({one: _fill_parts("old"), two: _fill_parts("old")})
    return one, two


def test_both_parts_are_replaced_together(two_parts: tuple[Path, Path]) -> None:
    one, two = two_parts
    files.replace_dirs({one: _fill_parts("new"), two: _fill_parts("new")})
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
        files.replace_dirs({one: _fill_parts("new"), two: _fill_parts("new")})
    monkeypatch.setattr(files, "_exchange", real)
    assert set(_tree(one).values()) == set(_tree(two).values()) == {"old"}
    assert sorted(p.name for p in one.parent.iterdir()) == ["helm-values", "manifests"]  # nothing left over


def test_a_full_disk_while_filling_is_an_error_and_leaves_the_old_output(two_parts: tuple[Path, Path]) -> None:
    one, two = two_parts

    def full(tmp: Path) -> None:
        (tmp / "a.yaml").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(GpushareError) as err:
        files.replace_dirs({one: _fill_parts("new"), two: full})
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
    files.replace_dir(_fill_parts("old"), target)

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
            files.replace_dirs({one: _fill_parts("new"), two: _fill_parts("new")})
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

# ---------------------------------------------------------------- aliases bounded by what they expand to


def _bomb(levels: int = 9) -> str:
    lines = ["    a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_stack_settings_is_refused_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpushare.yaml").write_text("apiVersion: gpushare.io/v1\nkind: Workspace\n")
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text("config:\n  gpushare:environment: environments/dev.yaml\n  gpushare:operatorValues:\n"
                     + _bomb())
    monkeypatch.setenv("GPUSHARE_ROOT", str(tmp_path))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        stack_config("dev")
    assert time.monotonic() - started < 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing was expanded
    problem = err.value.problems[0]
    assert problem.file == str(stack) and problem.line is not None and "expand to more than" in problem.message


def test_an_alias_that_contains_itself_is_refused() -> None:
    with pytest.raises(GpushareError) as err:
        parse_yaml("values: &a [1, *a]\n", "x.yaml")
    assert "without end" in str(err.value)


def test_ordinary_anchors_and_aliases_still_read() -> None:
    data = parse_yaml("base: &b {replicas: 2, rename: false}\none: *b\ntwo: *b\n" + _bomb(4).replace("    ", ""),
                      "x.yaml")
    assert data["one"] == data["two"] == {"replicas": 2, "rename": False} and len(data["a4"]) == 10

# ---------------------------------------------------------------- a large cluster dump, item by item


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

# ---------------------------------------------------------------- names longer than the file system takes


runner = CliRunner()


@pytest.mark.parametrize("length", [300, 250])
def test_init_refuses_a_name_too_long(tmp_path: Path, length: int) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / ("w" * length))])
    assert result.exit_code == 2, result.output
    assert "choose a shorter name" in result.output and "DIR" in result.output
    assert list(tmp_path.iterdir()) == []


def test_init_takes_a_long_name_that_fits(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / ("w" * 200))])
    assert result.exit_code == 0, result.output
    assert (tmp_path / ("w" * 200) / "gpushare.yaml").is_file()


def test_render_refuses_an_output_name_too_long(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "--env", "dev", "--out", str(tmp_path / ("r" * 250))])
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "choose a shorter name" in result.output
    assert list(tmp_path.iterdir()) == []

# ---------------------------------------------------------------- the YAML written for people


def test_multi_line_strings_are_literal_blocks_and_read_back_as_written() -> None:
    data = {"expr": "sum by (node) (\n  up\n)\n", "config": "a: 1\nb: 2", "one": "single line"}
    text = yaml_text(data)
    assert text == ("expr: |\n  sum by (node) (\n    up\n  )\n"
                    "config: |-\n  a: 1\n  b: 2\n"
                    "one: single line\n")
    assert yaml.safe_load(text) == data


def test_keys_keep_their_order_and_collections_are_block_style() -> None:
    data = {"zeta": 1, "alpha": {"y": [1, 2], "x": []}, "mid": True}
    text = yaml_text(data)
    assert text == "zeta: 1\nalpha:\n  y:\n  - 1\n  - 2\n  x: []\nmid: true\n"
    assert list(yaml.safe_load(text)) == ["zeta", "alpha", "mid"]


def test_long_text_breaks_at_the_first_space_past_the_width() -> None:
    words = [f"word{i:02d}" for i in range(60)]  # 7 characters and a space each
    text = yaml_text({"description": " ".join(words)})
    lines = text.splitlines()
    assert len(lines) > 1
    # A line ends with the word that crosses YAML_WIDTH: longer than the width, by less than a word and its space.
    assert all(YAML_WIDTH < len(line) <= YAML_WIDTH + 8 for line in lines[:-1]), [len(line) for line in lines]
    assert yaml.safe_load(text) == {"description": " ".join(words)}


def test_literal_blocks_are_never_broken() -> None:
    expr = "max by (hostname, UUID) (" + ", ".join(f"label_{i}" for i in range(40)) + ")\nor vector(0)"
    text = yaml_text({"expr": expr})
    assert text.splitlines()[1] == "  " + expr.splitlines()[0]
    assert yaml.safe_load(text)["expr"] == expr


def test_text_beyond_ascii_is_written_as_it_is() -> None:
    data = {"summary": "GPU at 85 °C", "name": "Übersicht — 日本"}
    text = yaml_text(data)
    assert "85 °C" in text and "Übersicht — 日本" in text and "\\x" not in text and "\\u" not in text
    assert yaml.safe_load(text) == data


def test_the_writers_that_were_separate_now_give_the_one_form() -> None:
    from gpushare.render.monitoring import rules_yaml
    from gpushare.render.templating import environment

    groups = [{"name": "g", "rules": [{"alert": "Hot", "expr": "a\n> 1", "annotations": {"summary": "at 90 °C"}}]}]
    assert rules_yaml(groups) == yaml_text(groups).rstrip("\n")
    config = {"version": "v1", "flags": {"migStrategy": "none"}, "note": "two\nlines"}
    rendered = environment().from_string("{{ data | to_yaml }}").render(data=config)
    assert rendered == yaml_text(config).rstrip("\n")


# Where gpushare still calls PyYAML's writer itself, and why (a Kubernetes controller's own configuration, embedded
# as a Helm value for Kueue to read, not a file for people).
NOT_FOR_PEOPLE = {"gpushare/program/components/tenancy.py"}


def test_no_other_yaml_writer_in_gpushare() -> None:
    found = []
    for path in sorted((ROOT / "gpushare").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gpushare/core/files.py" or rel in NOT_FOR_PEOPLE or "/ansible_collections/" in rel:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"\byaml\.(?:safe_)?dump(?:_all)?\(|Dumper\b", text):
            found.append(rel)
    assert found == [], f"write YAML with gpushare.core.files.yaml_text: {found}"
