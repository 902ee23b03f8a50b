"""The README's quick start, run as written on a fresh account (issue 42).

Each block of the README's "Quick start" is read from the README and its lines typed,
as written, into bash in a new home (tests/helpers/quick_start.py). What this machine
cannot give is put in, and only that:

- uv's installer (`curl ... | sh`) is not run: uv comes from the test venv, put where
  the installer puts it (`~/.local/bin`, on a new terminal's PATH), and reads a local
  directory of distributions offline, with this interpreter.
- The checkout at `~/src/exo-orphan-guard` is this work tree's files.
- systemd has no user session here: `systemctl` and `loginctl` are fakes
  (tests/helpers/fake_systemd.py), and the guardian is started as the written unit
  says. launchd is faked in-process as tests/helpers/service_fakes.py fakes it, given
  the CLI path a Mac's shell would give, with the real check that it starts from /.
- exo is a tree shaped like exo v1.0.71 (test_exo_uv_install's) whose `exo` says what
  it runs with; mlx.launch's hosts are two ranks on 127.0.0.1 on free ports, and its
  environment (mlx, the ranks' python3) the test venv's.
"""

from __future__ import annotations

import contextlib
import json
import os
import plistlib
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard.rig import ring_scenario, scenarios
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.tools import service, service_files
from exo_orphan_guard.tools.service_control import started_as_service

from .helpers import fake_systemd
from .helpers.dist import wheelhouse
from .helpers.guardian import READY, RunningGuardian
from .helpers.quick_start import (
    CHECKOUT,
    README_HOSTS,
    USER,
    UV_INSTALLER,
    Account,
    new_account,
    shell,
    the_quick_start,
    words,
)
from .helpers.service_fakes import UID, FakeManager
from .test_exo_uv_install import EXO_LIKE_PYPROJECT, MEMBER_PYPROJECT, REQUIREMENTS, SERIES
from .test_mlx_launch import free_port_pair
from .test_mlx_launch import rank_reports as launch_rank_reports
from .test_patching import build_tree

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux: mlx[cpu], /proc")

MLX_LAUNCH = Path(sys.executable).parent / "mlx.launch"
NEEDS_MLX = pytest.mark.skipif(
    not ring_scenario.mlx_available() or not MLX_LAUNCH.exists(),
    reason="needs mlx[cpu] and its mlx.launch (a test dependency on Linux)",
)
FORM_SECONDS = 60.0

EXO_MAIN = """
def main() -> None:
    import importlib.util, json, os
    import exo, exo_orphan_guard
    print(json.dumps({
        "toggle": os.environ.get("EXO_ORPHAN_GUARD"),
        "hooks": importlib.util.find_spec("exo.worker.orphan_guard") is not None,
        "package_file": exo_orphan_guard.__file__,
        "exo": exo.__file__,
    }))
"""

RANK_SCRIPT = """
import json, os, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
print(json.dumps({"rank": group.rank(), "pid": os.getpid(), "ppid": os.getppid(),
                  "sum": total.item()}), flush=True)
time.sleep(3600)
"""

PARENT_SCRIPT = """
import os
from pathlib import Path
print(Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\\0")[1].decode())
"""


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    """A new account where the quick start's first command has run."""
    with new_account(wheelhouse("uv-wheelhouse", REQUIREMENTS)) as made:
        said = made.run(the_quick_start().app[0]).stderr
        assert "Installed 1 executable: exo-orphan-guard" in said, said
        yield made


def test_the_quick_start_is_what_these_tests_run() -> None:
    """Every line of the quick start is one the tests below run (or, for uv's
    installer, stand in for): a line added to the README fails here first."""
    quick = the_quick_start()
    assert quick.get_uv == [UV_INSTALLER]
    assert [words(line)[:4] for line in quick.app] == [
        ["uv", "tool", "install", CHECKOUT],
        ["exo-orphan-guard", "service", "install"],
    ]
    assert [words(line)[:3] for line in quick.source] == [
        ["exo-orphan-guard", "patch", "apply"],
        ["cd", "~/src/exo", "&&"],
    ]
    (mlx,) = quick.mlx
    assert words(mlx)[:3] == ["mlx.launch", "--hosts", README_HOSTS]


def test_uv_tool_install_puts_the_cli_at_a_stable_path(account: Account) -> None:
    """A link to uv's own copy of the tool, built from the checkout; uv records where
    it came from."""
    tools = account.home / ".local" / "share" / "uv" / "tools" / "exo-orphan-guard"
    assert account.cli.is_symlink()
    assert account.cli.resolve().is_relative_to(tools)
    assert account.run("exo-orphan-guard --version").stdout.startswith("exo-orphan-guard ")
    (recorded,) = tools.glob("lib/python*/site-packages/exo_orphan_guard-*.dist-info")
    direct_url = json.loads((recorded / "direct_url.json").read_text())
    assert direct_url["url"] == (account.home / "src" / "exo-orphan-guard").as_uri()


def test_the_second_command_installs_a_unit_that_runs_the_installed_cli(
    account: Account,
) -> None:
    """Linux: the unit runs the CLI by its stable path, and the guardian it starts
    (from /, with systemd's environment, not the shell's) is what `service status`
    and `doctor` then show."""
    said = account.run(the_quick_start().app[1]).stdout
    assert f"the guardian runs as: {account.cli} service run --mode service" in said, said
    unit = account.home / ".config" / "systemd" / "user" / fake_systemd.UNIT_NAME
    (exec_start,) = [line for line in unit.read_text().splitlines() if "ExecStart=" in line]
    assert exec_start == f"ExecStart={account.cli} service run --mode service"
    guardian = RunningGuardian(
        {"HOME": str(account.home), "PATH": "/usr/bin:/bin"},
        command=shlex.split(exec_start.removeprefix("ExecStart=")),
        cwd="/",
    )
    try:
        guardian.wait_for(READY)
        status = account.run("exo-orphan-guard service status").stdout
        assert f"pid {guardian.pid}" in status, status
        doctor = shell("exo-orphan-guard doctor", account.home, account.env).stdout
        (line,) = [line for line in doctor.splitlines() if line[6:15] == "guardian "]
        assert line.startswith("OK") and f"pid {guardian.pid}" in line, doctor
    finally:
        assert guardian.stop() == 0


def test_the_second_command_on_a_mac_writes_a_launch_agent_for_the_installed_cli(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    """macOS, by injection: the same command with launchd faked, the CLI as a Mac's
    shell starts it (found on PATH); the check that it starts from / with launchd's
    environment runs it for real."""
    command = words(the_quick_start().app[1])
    assert command[1:] == ["service", "install"]
    argv0 = str(account.cli)
    assert shutil.which(command[0], path=account.env["PATH"]) == argv0
    fake = FakeManager(account.home)
    context = service.Context(
        manager="launchd",
        platform="darwin",
        home=account.home,
        uid=UID,
        home_owner=UID,
        name_of=lambda uid: USER if uid == UID else None,
        environ={"HOME": str(account.home), "PATH": account.env["PATH"]},
        cli=service_files.cli_words(argv0, sys.executable, argv0),
        run=fake,
        which=lambda name: f"/bin/{name}",
        starts=started_as_service,
        source=CHECKOUT,
    )
    assert service.install(context) == service.EXIT_OK, capsys.readouterr()
    plist = account.home / "Library" / "LaunchAgents" / f"{service_files.LABEL}.plist"
    agent = plistlib.loads(plist.read_bytes())
    assert agent["ProgramArguments"] == [str(account.cli), *service_files.RUN_WORDS]
    assert [call[:2] for call in fake.changes] == [
        ("launchctl", "enable"),
        ("launchctl", "bootstrap"),
    ]
    assert fake.loaded


def exo_like_project(tree: Path, account: Account) -> None:
    """test_exo_uv_install's exo-shaped project, locked, with an `exo` script."""
    tree.mkdir(parents=True)
    build_tree(tree, SERIES)
    (tree / "pyproject.toml").write_text(
        EXO_LIKE_PYPROJECT.replace(
            "[project.optional-dependencies]",
            '[project.scripts]\nexo = "exo.main:main"\n\n[project.optional-dependencies]',
        )
    )
    (tree / "src" / "exo" / "__init__.py").write_text("")
    (tree / "src" / "exo" / "main.py").write_text(EXO_MAIN)
    member = tree / "rust" / "exo_rs"
    (member / "src" / "exo_rs").mkdir(parents=True)
    (member / "pyproject.toml").write_text(MEMBER_PYPROJECT)
    (member / "src" / "exo_rs" / "__init__.py").write_text("")
    account.run("uv lock", cwd=tree)


def test_exo_from_source_runs_patched_with_the_package_from_the_checkout(
    account: Account,
) -> None:
    tree = account.home / "src" / "exo"
    exo_like_project(tree, account)
    patch_line, run_line = the_quick_start().source
    applied = account.run(patch_line).stdout
    assert applied.startswith(f"series {SERIES.name} ("), applied
    # Its advice names what the CLI was installed from: the quick start's next line.
    checkout = account.home / "src" / "exo-orphan-guard"
    assert f"(uv run --with {checkout} exo)" in applied, applied
    report = json.loads(account.run(run_line).stdout)
    assert report["toggle"] == "true"
    assert report["hooks"] is True
    assert Path(report["exo"]).is_relative_to(tree / "src")  # exo's own project
    # uv built the package from the checkout into that run's environment only.
    package = Path(report["package_file"])
    assert not package.is_relative_to(account.home / "src"), package
    assert not package.is_relative_to(tree), package


def mlx_terminal(account: Account, directory: Path, mlx_bin: Path) -> dict[str, str]:
    """The account's terminal with an mlx environment active (its mlx.launch and
    python3 first on PATH); mlx.launch's temporary files in `directory`."""
    return {**account.env, "PATH": f"{mlx_bin}:{account.env['PATH']}", "TMPDIR": str(directory)}


@pytest.fixture
def launchers() -> Iterator[list[tuple[subprocess.Popen[bytes], list[ProcessIdentity]]]]:
    started: list[tuple[subprocess.Popen[bytes], list[ProcessIdentity]]] = []
    yield started
    for process, tracked in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        for identity in scenarios.alive(tracked):
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGKILL)
        scenarios.wait_gone(tracked, 5.0)


@NEEDS_MLX
def test_mlx_launch_ranks_run_under_the_installed_cli_and_die_with_the_launcher(
    account: Account,
    tmp_path: Path,
    launchers: list[tuple[subprocess.Popen[bytes], list[ProcessIdentity]]],
) -> None:
    mlx_bin = tmp_path / "mlx-env" / "bin"
    mlx_bin.mkdir(parents=True)
    (mlx_bin / "mlx.launch").symlink_to(MLX_LAUNCH)
    (mlx_bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (mlx_bin / "python3").chmod(0o755)
    env = mlx_terminal(account, tmp_path, mlx_bin)
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    (line,) = the_quick_start().mlx

    by_name = shell(line.replace(README_HOSTS, "h1,h2"), tmp_path, env)
    assert by_name.returncode != 0 and "requires IPs" in by_name.stderr, by_name.stderr

    here = f"127.0.0.1,127.0.0.1 --starting-port {free_port_pair()}"
    process = subprocess.Popen(
        ["bash", "-c", f"exec {line.replace(README_HOSTS, here)}"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    tracked: list[ProcessIdentity] = []
    launchers.append((process, tracked))
    reports = rank_reports(process, tracked)
    assert {rank: report["sum"] for rank, report in reports.items()} == {0: 3.0, 1: 3.0}
    for report in reports.values():
        argv = Path(f"/proc/{int(report['ppid'])}/cmdline").read_bytes().split(b"\0")
        # Each rank's parent is the wrapper: the installed CLI, by the README's path.
        assert argv[1:5] == [str(account.cli).encode(), b"exec", b"--stdin-hup", b"--"]
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    exits = scenarios.wait_gone(tracked, 5.0)
    assert all(seen is not None for seen in exits.values()), "a rank outlived mlx.launch"


def rank_reports(
    process: subprocess.Popen[bytes], tracked: list[ProcessIdentity]
) -> dict[int, dict[str, float]]:
    """Each rank's line, once the group formed; each rank and its parent tracked."""
    assert process.stdout is not None
    return launch_rank_reports(process.stdout, tracked, FORM_SECONDS, parents=True)


def test_mlx_0_31_runs_a_bare_name_by_its_path_on_the_launching_host(
    account: Account, tmp_path: Path
) -> None:
    """The README's note on mlx 0.31 and older, with mlx 0.31.1's own mlx.launch: a
    command found on PATH becomes its path on the launching host (the wrapper runs
    from there), a path to a file becomes `python <file>` (mlx's python: no CLI)."""
    mlx_031 = tmp_path / "mlx-0.31"
    account.run(f"uv venv -q {mlx_031}")
    account.run(f"uv pip install -q -p {mlx_031}/bin/python 'mlx[cpu]==0.31.1'")
    env = mlx_terminal(account, tmp_path, mlx_031 / "bin")
    (tmp_path / "rank.py").write_text(PARENT_SCRIPT)
    (line,) = the_quick_start().mlx
    as_written = line.replace(README_HOSTS, "127.0.0.1")
    bare = as_written.replace("~/.local/bin/exo-orphan-guard", "exo-orphan-guard")
    assert bare != as_written

    by_name = shell(bare, tmp_path, env)
    assert by_name.stdout.strip() == str(account.cli), by_name.stdout + by_name.stderr
    # mlx 0.31's launcher drops what a rank wrote if the rank exits before its reader
    # thread first polls it (a failed import does, on a busy machine): what ran is
    # written down by the interpreter itself, at start-up (sitecustomize).
    ran = tmp_path / "ran.json"
    (tmp_path / "sitecustomize.py").write_text(
        "import json, sys\n"
        "if sys.argv[0].endswith('exo-orphan-guard'):\n"
        f"    with open({str(ran)!r}, 'a') as log:\n"
        "        print(json.dumps([sys.prefix, sys.argv[0]]), file=log)\n"
    )
    by_path = shell(as_written, tmp_path, {**env, "PYTHONPATH": str(tmp_path)})
    said = by_path.stdout + by_path.stderr
    assert "Node with rank 0 exited with code 1" in by_path.stderr, said
    assert json.loads(ran.read_text()) == [str(mlx_031), str(account.cli.resolve())], said
