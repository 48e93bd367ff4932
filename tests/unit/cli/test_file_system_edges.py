"""Files at the edges (issue 39, third round): `pack --env-out` naming one of pack's own inputs, two `gpushare init`
of one new directory at once, a profile that is a symbolic link to itself, a full disk under `schema --out`,
`preview --out`, `init`, `init --example` and `capacity --backfill-rules` (a real tmpfs of a few KB, mounted here),
a kubeconfig that is not one under `drift` and `diff`, and a control character in an `--env` file name. Each ends
with exit 2 (or the command's own refusal) and a message naming the file and the fix, and leaves nothing behind:
no folder or file the command created, no input replaced."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT


def gpushare(*args: str, cwd: Path, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m gpushare ARGS` as users run it (the exit-code boundary included), in `cwd`; GPUSHARE_ROOT is
    `root` where given, else unset (the workspace is found from `cwd`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSHARE_ROOT", "GPUSHARE_DEBUG")}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    if root is not None:
        env["GPUSHARE_ROOT"] = str(root)
    return subprocess.run([sys.executable, "-m", "gpushare", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def tree(path: Path) -> dict[str, str]:
    """Every file and link under `path` by content (a link by where it points), and every folder."""
    out: dict[str, str] = {}
    for item in sorted(path.rglob("*")):
        rel = str(item.relative_to(path))
        if item.is_symlink():
            out[rel] = "-> " + os.readlink(item)
        elif item.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(item.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace of `gpushare init`, with the demand example."""
    from gpushare.cli.init import write_example, write_workspace

    ws = tmp_path_factory.mktemp("hardening") / "ws"
    write_workspace(ws)
    write_example("demand", ws)
    return ws


# ---------------------------------------------------------------- pack --env-out naming an input


@pytest.mark.parametrize(("env_out", "said"), [
    ("environments/dev.yaml", "--env-out would replace input"),
    ("./environments/../environments/dev.yaml", "--env-out would replace input"),
    ("link-to-dev.yaml", "--env-out would replace input"),  # a symbolic link to it: compared resolved
    ("examples/demand/inference.yaml", "--env-out would replace input"),  # the demand file itself
    ("policies/guardrails.yaml", "--env-out would replace input"),
    ("profiles/new.yaml", "--env-out lies inside the input directory"),
])
def test_pack_refuses_an_env_out_that_is_one_of_its_inputs(workspace: Path, env_out: str, said: str) -> None:
    link = workspace / "link-to-dev.yaml"
    if not link.is_symlink():
        link.symlink_to("environments/dev.yaml")
    before = tree(workspace)
    run = gpushare("pack", "--fleet", "dev", "--demand", "examples/demand/inference.yaml", "--env-out", env_out,
                   "--time-limit", "30", cwd=workspace)
    assert run.returncode == 2, run.stdout + run.stderr
    assert said in run.stderr and "fix:" in run.stderr, run.stderr
    assert tree(workspace) == before  # the environment file, the profiles and the demand untouched


def test_pack_still_writes_an_env_out_beside_the_inputs(workspace: Path, tmp_path: Path) -> None:
    out = tmp_path / "dev-patch.yaml"
    run = gpushare("pack", "--fleet", "dev", "--demand", "examples/demand/inference.yaml", "--env-out", str(out),
                   "--time-limit", "30", cwd=workspace)
    assert run.returncode == 0, run.stdout + run.stderr
    assert out.is_file() and "the reviewed patch written to" in run.stdout, run.stdout


# ---------------------------------------------------------------- two inits of one directory


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "without renameat2"])
def test_an_init_that_loses_the_race_for_a_new_directory_refuses_and_leaves_the_winner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renameat2: bool) -> None:
    """While the first init builds its workspace beside the target, a second init of the same directory runs to
    its end (and the user starts working in it: the file `mine`). The first must then stop with exit 2, not put
    its own tree in place of the second's; also where the C library has no renameat2 (checked, then renamed)."""
    from gpushare.cli import init
    from gpushare.core import files
    from gpushare.core.errors import GpushareError

    if not renameat2:
        monkeypatch.setattr(files, "_renameat2", lambda: None)

    target = tmp_path / "fleet"
    real_fill = init._fill
    calls: list[Path] = []

    def racing_fill(tmp: Path, where: Path) -> None:
        calls.append(tmp)
        real_fill(tmp, where)
        if len(calls) == 1:  # the first init, its tree built: the second one runs now, to its end
            init.write_workspace(target)
            (target / "mine").write_text("the second init's workspace, in use")

    monkeypatch.setattr(init, "_fill", racing_fill)
    with pytest.raises(GpushareError) as err:
        init.write_workspace(target)
    assert err.value.exit_code == 2
    assert "another process wrote into the workspace directory" in str(err.value), str(err.value)
    assert (target / "mine").read_text() == "the second init's workspace, in use"
    assert (target / "gpushare.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet"]  # the loser's tree is gone


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "without renameat2"])
def test_the_race_into_an_existing_empty_directory_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  renameat2: bool) -> None:
    """A directory holding only .git (a clone) is filled entry by entry: the loser's first rename finds the
    winner's file there and stops, taking out nothing of the winner's."""
    from gpushare.cli import init
    from gpushare.core import files
    from gpushare.core.errors import GpushareError

    if not renameat2:
        monkeypatch.setattr(files, "_renameat2", lambda: None)

    target = tmp_path / "fleet"
    (target / ".git").mkdir(parents=True)
    real_fill = init._fill
    calls: list[Path] = []

    def racing_fill(tmp: Path, where: Path) -> None:
        calls.append(tmp)
        real_fill(tmp, where)
        if len(calls) == 1:
            init.write_workspace(target)
            (target / ".gitignore").write_text("# the second init's, edited\n")

    monkeypatch.setattr(init, "_fill", racing_fill)
    with pytest.raises(GpushareError) as err:
        init.write_workspace(target)
    assert err.value.exit_code == 2, str(err.value)
    assert (target / ".gitignore").read_text() == "# the second init's, edited\n"
    assert (target / "gpushare.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet"]


def test_two_init_processes_of_one_new_directory_one_wins(tmp_path: Path) -> None:
    target = tmp_path / "fleet"
    env = {**{k: v for k, v in os.environ.items() if k != "GPUSHARE_ROOT"}, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-m", "gpushare", "init", str(target)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.returncode, out, err) for p in runs for out, err in [p.communicate(timeout=600)]]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    assert "fleet" in loser and "fix:" in loser, loser
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet"]
    assert gpushare("validate", "--env", "dev", cwd=target).returncode == 0


# ---------------------------------------------------------------- a symbolic link loop among the profiles


@pytest.mark.parametrize("links", [{"loop.yaml": "loop.yaml"}, {"a.yaml": "b.yaml", "b.yaml": "a.yaml"}],
                         ids=["to itself", "two to each other"])
@pytest.mark.parametrize("command", ["validate", "plan", "render"])
def test_a_profile_link_in_a_loop_is_bad_input_naming_it(workspace: Path, tmp_path: Path, links: dict[str, str],
                                                         command: str) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws, symlinks=True)
    for name, target in links.items():
        (ws / "profiles" / name).symlink_to(target)
    args = [command, "--env", "dev"] + (["--out", str(tmp_path / "out")] if command == "render" else [])
    run = gpushare(*args, cwd=ws)
    assert run.returncode == 2, run.stdout + run.stderr
    for name in links:
        assert f"profiles/{name}: profile file is a symbolic link in a loop" in run.stderr, run.stderr
    assert "internal error" not in run.stderr and "fix: remove the link" in run.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a full disk


class Disk:
    """A tmpfs of a few KB mounted for one test: a real file system that runs out of space."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """Take all space but `leave` bytes with one file (the only thing on the disk a test expects after)."""
        filler = self.path / "filler"
        filler.unlink(missing_ok=True)
        with open(filler, "wb") as handle:
            handle.write(b"\0" * max(0, self.free() - leave))

    def contents(self) -> list[str]:
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*"))


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mount)], check=True)
    try:
        yield Disk(mount)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def full(run: subprocess.CompletedProcess[str], path: str) -> None:
    """A full disk's answer: exit 2, the path, that the disk is full and what to do; no internal error."""
    assert run.returncode == 2, run.stdout + run.stderr
    assert "internal error" not in run.stderr, run.stderr
    assert path in run.stderr and "No space left on device (the file system is full)" in run.stderr, run.stderr
    assert "fix: free space on the file system" in run.stderr, run.stderr


def test_schema_on_a_full_disk_leaves_nothing_and_replaces_nothing(disk: Disk, workspace: Path) -> None:
    disk.fill(leave=16 * 1024)
    full(gpushare("schema", "--out", str(disk.path / "new" / "schema"), cwd=workspace), str(disk.path / "new"))
    assert disk.contents() == ["filler"]  # neither new/ nor new/schema/ nor a temporary file
    # Over an earlier output: every schema file stays the old one (none half-replaced), no temporary file stays.
    (disk.path / "filler").unlink()
    assert gpushare("schema", "--out", str(disk.path / "schema"), cwd=workspace).returncode == 0
    before = tree(disk.path / "schema")
    for path in (disk.path / "schema").iterdir():
        path.write_text(path.read_text() + "\n")  # "older" files, so a replacement would show
    before = tree(disk.path / "schema")
    disk.fill(leave=16 * 1024)
    full(gpushare("schema", "--out", str(disk.path / "schema"), cwd=workspace), str(disk.path / "schema"))
    assert tree(disk.path / "schema") == before


def test_preview_on_a_full_disk_removes_the_folders_it_made(disk: Disk, workspace: Path) -> None:
    disk.fill(leave=16 * 1024)
    full(gpushare("preview", "--env", "dev", "--out", str(disk.path / "build" / "dev"), cwd=workspace),
         str(disk.path / "build" / "dev"))
    assert disk.contents() == ["filler"]


def test_init_on_a_full_disk_leaves_nothing(disk: Disk, tmp_path: Path) -> None:
    disk.fill(leave=16 * 1024)
    full(gpushare("init", str(disk.path / "a" / "fleet"), cwd=tmp_path), str(disk.path / "a" / "fleet"))
    assert disk.contents() == ["filler"]


def test_init_example_on_a_full_disk_writes_no_file_of_it(disk: Disk, tmp_path: Path) -> None:
    ws = disk.path / "ws"
    assert gpushare("init", str(ws), cwd=tmp_path).returncode == 0
    before = tree(ws)
    disk.fill(leave=4096)  # room for the first of the example's two files, not for both
    full(gpushare("init", "--example", "demand", cwd=ws), "examples/demand/")
    assert tree(ws) == before  # no examples/, no examples/demand/inference.yaml


def test_backfill_on_a_full_disk_removes_the_pass_it_began(disk: Disk, tmp_path: Path, workspace: Path) -> None:
    """A real, empty Prometheus: the first pass has everything to record, and its rules file does not fit."""
    from tests.prometheus.server import prometheus_server

    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("needs Debian's prometheus package (make promtool)")
    data = tmp_path / "tsdb"
    data.mkdir()
    disk.fill(leave=0)
    with prometheus_server(data, tmp_path) as url:
        run = gpushare("capacity", "--env", "dev", "--prometheus", url, "--window", "1h", "--backfill-rules",
                       str(disk.path / "blocks"), cwd=workspace)
    full(run, str(disk.path / "blocks"))
    assert disk.contents() == ["filler"]  # neither blocks/ nor its level folder


# ---------------------------------------------------------------- a kubeconfig that is not one


@pytest.mark.parametrize(("text", "said"), [
    (b"apiVersion: v1\nclusters: [\n", ":3: --kubeconfig: not a kubeconfig: not valid YAML"),
    (b"- just\n- a list\n", "--kubeconfig: not a kubeconfig: the top level is a list"),
    (b"\xff\xfe\x00\x01garbage", "--kubeconfig: not a kubeconfig"),
    (b"contexts: [{name: a, context: 5}]\ncurrent-context: a\n", "--kubeconfig: not a kubeconfig"),
])
@pytest.mark.parametrize("command", ["drift", "diff"])
def test_a_kubeconfig_that_is_not_one_is_bad_input_naming_the_file(workspace: Path, tmp_path: Path, text: bytes,
                                                                   said: str, command: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(text)
    run = gpushare(command, "--env", "dev", "--kubeconfig", str(kubeconfig), cwd=workspace)
    assert run.returncode == 2, run.stdout + run.stderr
    assert str(kubeconfig) in run.stderr and said in run.stderr and "fix:" in run.stderr, run.stderr
    assert "internal error" not in run.stderr


# ---------------------------------------------------------------- control characters in names from input


def test_an_escape_in_an_env_file_name_is_shown_not_sent_to_the_terminal(workspace: Path, tmp_path: Path) -> None:
    folder = workspace / "inputs" / "\x1b[31mred\x1b]0;owned\x07"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(workspace / "environments" / "dev.yaml", folder / "dev.yaml")
    ok = gpushare("validate", "--env", str(folder.relative_to(workspace) / "dev.yaml"), cwd=workspace)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "\x1b" not in ok.stdout and "\x07" not in ok.stdout, repr(ok.stdout)
    assert "inputs/\\x1b[31mred\\x1b]0;owned\\x07/dev.yaml" in ok.stdout, ok.stdout
    named = folder / "\x1b[2Jdev.yaml"  # a name that does not match the file's `name:`: an error quoting it
    shutil.copy(workspace / "environments" / "dev.yaml", named)
    bad = gpushare("validate", "--env", str(named.relative_to(workspace)), cwd=workspace)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "\x1b" not in bad.stderr and "\x07" not in bad.stderr, repr(bad.stderr)
    assert "\\x1b[2Jdev.yaml" in bad.stderr, bad.stderr
    missing = gpushare("plan", "--env", "inputs/\u202emissing.yaml", cwd=workspace)  # a bidi override
    assert missing.returncode == 2 and "\u202e" not in missing.stderr and "\\u202e" in missing.stderr, missing.stderr
    out = tmp_path / "\x1b[31mout.yaml"
    packed = gpushare("pack", "--demand", "examples/demand/inference.yaml", "--env-out", str(out), "--time-limit",
                      "30", cwd=workspace)
    assert packed.returncode == 0 and "\x1b" not in packed.stdout, repr(packed.stdout)
    shutil.rmtree(workspace / "inputs")


# ---------------------------------------------------------------- several files, all or none


def test_write_files_puts_back_what_it_replaced_when_a_later_rename_fails(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from gpushare.core import files
    from gpushare.core.errors import GpushareError

    out = tmp_path / "out"
    a, b = out / "a.json", out / "b.json"
    files.write_files({a: "old a", b: "old b"})
    real = os.replace
    calls: list[str] = []

    def second_fails(source: str, target: str) -> None:
        calls.append(target)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real(source, target)

    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(GpushareError) as err:
        files.write_files({a: "new a", b: "new b"})
    monkeypatch.setattr(files.os, "replace", real)
    assert err.value.exit_code == 2 and "Input/output error" in str(err.value)
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.json"]  # no temporary file, no backup
    calls.clear()
    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(GpushareError):
        files.write_files({tmp_path / "new" / "deep" / "a.json": "a", tmp_path / "new" / "deep" / "b.json": "b"})
    assert not (tmp_path / "new").exists()  # the folders it made, gone with the file it had renamed in
