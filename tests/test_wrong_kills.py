"""Each way a sweep could harm what is not an orphan, planted with real processes.

Every test here plants the innocent process, runs the real sweep, and checks the
process table. Each failed on the code before these rules existed (see docs/reference.md,
"Never-kill rules", for the rule each one backs).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.registry import LOCK_NAME, Registry, RunnerRecord, host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system._linux import group_members, read_stat
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from exo_orphan_guard.system.process_facts import Pid
from tests.conftest import StartWorker
from tests.helpers.cli import CLI, report_of, run_cli
from tests.helpers.processes import NOBODY, start_orphan

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="plants processes via /proc")


# --- 1. a live exo whose worker does not look like exo ---------------------------------


@pytest.mark.machine_wide
@pytest.mark.parametrize("launcher", [(), ("nohup",)])
def test_runners_of_a_live_worker_started_as_plain_python_survive(
    exo_python: str, launcher: tuple[str, ...]
) -> None:
    """`python -m exo` from an activated venv (or under nohup): argv[0] is `python`,
    exe() the base interpreter. The worker does not look like exo; its runners do."""
    env = {"PATH": f"{Path(exo_python).parent}:{os.environ['PATH']}"}
    worker = scenarios.start_worker(
        ["idle", "child"], watch="none", python="python", extra_env=env, launcher=launcher
    )
    try:
        assert psutil.Process(worker.pid).cmdline()[0] == "python"
        members = worker.all_processes()
        report = report_of(run_cli("sweep", "--json", "--grace", "0.2"))
        time.sleep(0.2)
        assert scenarios.alive(members) == members
        assert not {suspect["pid"] for suspect in report["suspects"]} & {m.pid for m in members}
    finally:
        scenarios.cleanup(worker)


# --- 2. a reused process group ---------------------------------------------------------


@pytest.mark.parametrize("leader", ["reaped", "zombie"])
def test_members_of_a_reused_group_id_survive(
    planted: list[ProcessIdentity], isolated_environment: Path, leader: str
) -> None:
    """A dead runner's record stays until a sweep; meanwhile its pid (so its group id)
    went to a process that led a group and left members (`cmd | less`, `setsid -f`)."""
    token = uuid.uuid4().hex
    # The new group leader starts a member, then exits (reaped by init), or stays a
    # zombie under a parent that never reaps it.
    leader_code = (
        "import os, subprocess, sys, time; os.setpgid(0, 0); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
        f"'{token}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(os.getpid(), flush=True); os._exit(0)"
    )
    if leader == "reaped":
        shell = subprocess.run(
            [sys.executable, "-c", leader_code], capture_output=True, text=True, check=True
        )
        group = int(shell.stdout.split()[0])
    else:
        parent_code = (
            f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            f"{leader_code!r}], stdout=subprocess.PIPE, text=True); "
            "print(p.stdout.readline().strip(), flush=True); time.sleep(600)"
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None
        group = int(holder.stdout.readline())
        holder_identity = identity_of(holder.pid)
        assert holder_identity is not None
        planted.append(holder_identity)
        deadline = time.monotonic() + 5
        while (stat := read_stat(group)) is None or stat.state != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    members = [
        identity for pid in _linux_group(group) if (identity := identity_of(pid)) is not None
    ]
    assert members, "the new leader's member should be there"
    planted.extend(members)
    started = min(member.started for member in members)
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    # The runner that once had this pid started earlier, under a worker now dead.
    registry.write(_record(group, started - 50.0, argv=("python", "--multiprocessing-fork")))
    report = sweep(grace=0.2, fingerprint=False)
    assert not {verdict.pid for verdict in report.targets} & {m.pid for m in members}
    assert scenarios.alive(members) == members


def _linux_group(group: int) -> list[int]:
    return [int(pid) for pid in group_members([group])]


# --- 3. two sweeps at once ---------------------------------------------------------------


def test_two_match_sweeps_started_together_never_signal_each_other(
    planted: list[ProcessIdentity], isolated_environment: Path
) -> None:
    """Both sweeps' own command lines match the regex they were given."""
    token = f"eog-twin-{uuid.uuid4().hex}"
    target = start_orphan(["/bin/sh", "-c", f"trap '' TERM; sleep 600; : {token}"])
    planted.append(target)
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    lock = os.open(registry.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # both sweeps wait for it, then take turns
    arguments = [
        *("sweep", "--json", "--grace", "0.5", "--registry-only"),
        *("--match", token, "--any-parent"),
    ]
    sweeps = [
        subprocess.Popen(
            [*CLI, *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(1.0)
    os.close(lock)
    outputs = [process.communicate(timeout=60) for process in sweeps]
    codes = [process.returncode for process in sweeps]
    assert codes == [0, 0], (codes, outputs)
    spared = [entry for out, _ in outputs for entry in json.loads(out)["spared"]]
    assert any("exo-orphan-guard" in entry["reason"] for entry in spared)
    assert liveness(target) == "gone"


# --- 4. another machine's records --------------------------------------------------------


def test_records_of_another_pid_namespace_are_never_read_nor_deleted(
    isolated_environment: Path, tmp_path: Path
) -> None:
    """A registry shared by containers (or over NFS): a guarded runner in another pid
    namespace records itself; a sweep here must leave its record alone."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a second pid namespace needs root and unshare")
    namespace = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--"]
    inside = (
        "import subprocess, sys; subprocess.run(['hostname', 'other-box'], check=True); "
        "from exo_orphan_guard.rig import scenarios; "
        "w = scenarios.start_worker(['idle']); print('ready', flush=True); sys.stdin.read()"
    )
    other = subprocess.Popen(
        [*namespace, sys.executable, "-c", inside],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=scenarios.scenario_environment("guard", "auto", isolated_environment),
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "ready"
        theirs = [
            path
            for path in isolated_environment.rglob("runner-*.json")
            if path.parent != host_directory(isolated_environment)
        ]
        assert len(theirs) == 1, list(isolated_environment.rglob("*"))
        report = sweep(grace=0.2, fingerprint=False)
        assert theirs[0].exists(), "another namespace's live record was deleted"
        assert all(
            verdict.record is None or verdict.record.path != theirs[0]
            for verdict in report.verdicts
        )
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=10)  # its init exits: the kernel kills everything inside


# --- 5. unknown is not gone ----------------------------------------------------------------

_SWEEP_WITH_UNREADABLE = """
import errno, json, os, sys
from exo_orphan_guard.system import _linux
from exo_orphan_guard.sweeper.sweeping import sweep

path, code = sys.argv[1], getattr(errno, sys.argv[2])
real = _linux._read_small

def read(name: str) -> bytes:
    if name == path:
        raise OSError(code, os.strerror(code))
    return real(name)

_linux._read_small = read
report = sweep(grace=0.2, fingerprint=False)
print(json.dumps({
    "targets": [verdict.pid for verdict in report.targets],
    "forgotten": [verdict.pid for verdict in report.verdicts if verdict.action == "forget"],
}))
"""


_injects_into_proc = pytest.mark.skipif(
    system.BACKEND != "linux", reason="injects errors into the /proc reader of the Linux backend"
)


def sweep_unable_to_read(path: str, code: str) -> dict[str, list[int]]:
    """A sweep in its own process (not the workers' ancestor) for which reading
    `path` fails with errno `code`."""
    completed = subprocess.run(
        [sys.executable, "-c", _SWEEP_WITH_UNREADABLE, path, code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, list[int]] = json.loads(completed.stdout)
    return result


@_injects_into_proc
def test_a_worker_that_cannot_be_read_is_not_taken_for_dead(start_worker: StartWorker) -> None:
    worker = start_worker(["idle"])
    (runner,) = worker.runners
    result = sweep_unable_to_read(f"/proc/{worker.pid}/stat", "EMFILE")
    assert runner.identity.pid not in result["targets"]
    time.sleep(0.2)
    assert liveness(runner.identity) == "alive"


@_injects_into_proc
def test_a_runner_that_cannot_be_read_keeps_its_record(
    start_worker: StartWorker, isolated_environment: Path
) -> None:
    # A thread-only watch cannot end a GIL-held runner: a real orphan, recorded.
    worker = start_worker(["gil"], strategy="sentinel")
    (runner,) = worker.runners
    scenarios.kill_worker(worker)
    record = host_directory(isolated_environment) / f"runner-{runner.identity.pid}.json"
    assert record.exists()
    result = sweep_unable_to_read(f"/proc/{runner.identity.pid}/stat", "EACCES")
    # While it cannot be read, nothing is concluded: not "exited", record kept.
    assert result == {"targets": [], "forgotten": []}
    assert record.exists() and liveness(runner.identity) == "alive"


# --- root: other users ------------------------------------------------------------------


def test_root_is_told_how_many_other_users_processes_were_spared(
    planted: list[ProcessIdentity], tmp_path: Path
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("starting a process as another user needs root and setpriv")
    token = f"eog-nobody-{uuid.uuid4().hex}"
    # /bin/sh, not this venv's python: `nobody` may not be able to read the latter.
    nobody = start_orphan(["/bin/sh", "-c", f"sleep 600; : {token}"], user=NOBODY)
    planted.append(nobody)
    report = report_of(run_cli("sweep", "--json", "--registry-only", "--match", token))
    assert report["other_users_spared"] == 1 and "other users spared" in report["summary"]
    assert liveness(nobody) == "alive"
    arguments = ("sweep", "--json", "--registry-only", "--match", token, "--all-users")
    report = report_of(run_cli(*arguments))
    assert [suspect["pid"] for suspect in report["suspects"]] == [nobody.pid]
    assert scenarios.wait_gone([nobody], 3.0)[nobody] is not None


def _record(pid: int, started: float, *, argv: tuple[str, ...]) -> RunnerRecord:
    return RunnerRecord(
        pid=Pid(pid),
        started=started,
        boot_id=system.boot_id(),
        uid=os.geteuid(),
        worker=ProcessIdentity(Pid(os.getpid()), 1.0),  # a worker long gone
        exe=None,
        argv=argv,
        pgid=pid,
        recorded_at=time.time(),
        labels={"runner_id": "planted"},
    )
