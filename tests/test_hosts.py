"""`scan/sweep/doctor --hosts` and ranks under sshd, against real sshd servers on loopback.

Hosts: `eog-a` and `eog-b` have the CLI on their PATH, `eog-nocli` has not, `eog-down`
has nobody listening. Every planted process carries a fresh token and every scan or
sweep is `--registry-only --match TOKEN` (the test's own registry), so nothing else on
this shared machine is found or touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers import cli, sshd

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.LoopbackSshd]:
    reason = sshd.why_sshd_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("hosts")
    # "Installed" on a host = on the PATH its ssh sessions get.
    installed = root / "installed-bin"
    installed.mkdir()
    (installed / "exo-orphan-guard").symlink_to(Path(sys.executable).parent / "exo-orphan-guard")
    registry = root / "registry"
    with_cli = {"PATH": f"{installed}:/usr/bin:/bin", "EXO_ORPHAN_GUARD_DIR": str(registry)}
    without_cli = {"PATH": "/usr/bin:/bin", "EXO_ORPHAN_GUARD_DIR": str(registry)}
    loopback = sshd.start_loopback_sshd(
        root / "ssh",
        {"eog-a": with_cli, "eog-b": with_cli, "eog-nocli": without_cli},
        unreachable=("eog-down",),
    )
    try:
        found = subprocess.run(
            loopback.ssh_argv("eog-nocli", "command -v exo-orphan-guard"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
        if found.returncode == 0:
            pytest.skip("the login shell's rc files put an exo-orphan-guard on every PATH")
        yield loopback
    finally:
        loopback.stop()


@pytest.fixture
def token() -> str:
    return f"eog-hosts-{uuid.uuid4().hex}"


def run_cli(cluster: sshd.LoopbackSshd, *words: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EXO_ORPHAN_GUARD_SSH_COMMAND=cluster.ssh_command)
    return cli.run_cli(*words, env=env, timeout=120)


def hosts_json(cluster: sshd.LoopbackSshd, *words: str) -> tuple[int, dict[str, Any]]:
    completed = run_cli(cluster, *words, "--json")
    document: dict[str, Any] = json.loads(completed.stdout)
    assert document["schema"] == "exo-orphan-guard/hosts-report/1"
    assert document["exit_code"] == completed.returncode
    return completed.returncode, document


def by_host(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["host"]: entry for entry in document["hosts"]}


def test_each_host_gets_its_result_or_its_one_line_error(
    cluster: sshd.LoopbackSshd, token: str
) -> None:
    code, document = hosts_json(
        cluster,
        "scan",
        "--hosts",
        "eog-a,eog-nocli,eog-down",
        "--registry-only",
        "--match",
        token,
        "--any-parent",
    )
    hosts = by_host(document)
    assert [entry["host"] for entry in document["hosts"]] == ["eog-a", "eog-nocli", "eog-down"]
    assert hosts["eog-a"]["status"] == "ok" and hosts["eog-a"]["exit_code"] == 0
    report = hosts["eog-a"]["report"]
    assert report["schema"] == "exo-orphan-guard/sweep-report/1" and report["suspects"] == []
    assert hosts["eog-nocli"]["status"] == "not-installed"
    assert "EXO_ORPHAN_GUARD_REMOTE_CLI" in hosts["eog-nocli"]["error"]
    assert hosts["eog-down"]["status"] == "unreachable"
    assert "Connection refused" in hosts["eog-down"]["error"]
    for entry in (hosts["eog-nocli"], hosts["eog-down"]):
        assert entry["exit_code"] == 3 and entry["report"] is None
        assert "\n" not in entry["error"]
    assert code == 3


def test_the_table_names_each_host_and_the_exit_code_is_the_worst(
    cluster: sshd.LoopbackSshd, token: str
) -> None:
    completed = run_cli(
        cluster, "scan", "--hosts", "eog-a,eog-b", "--registry-only", "--match", token
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert [line for line in lines if line.startswith("== ")] == [
        line for line in lines if re.fullmatch(r"== eog-[ab]: OK, exit 0 \(\d+\.\d s\) ==", line)
    ]
    assert len([line for line in lines if line.startswith("== ")]) == 2
    assert lines[-1] == "2 host(s), 2 checked, worst exit 0"


def test_usage_errors_are_caught_before_any_host_is_reached(cluster: sshd.LoopbackSshd) -> None:
    completed = run_cli(cluster, "sweep", "--hosts", "eog-a", "--any-parent")
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith("exo-orphan-guard: error: --any-parent needs --match")
    completed = run_cli(cluster, "scan", "--hosts", "eog-a,,eog-b")
    assert completed.returncode == 2 and "empty" in completed.stderr


def test_doctor_reads_an_mlx_launch_hostfile(cluster: sshd.LoopbackSshd, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps([{"ssh": "eog-a", "ips": ["127.0.0.1"]}, {"ssh": "eog-a", "ips": []}])
    )
    code, document = hosts_json(cluster, "doctor", "--hostfile", str(hostfile))
    assert [entry["host"] for entry in document["hosts"]] == ["eog-a"]
    entry = document["hosts"][0]
    assert entry["status"] == "ok" and code == entry["exit_code"] in (0, 1)
    assert {check["name"] for check in entry["report"]["checks"]} >= {"guard", "orphans"}


# --- ranks under sshd ------------------------------------------------------------------


def start_rank_over_ssh(
    cluster: sshd.LoopbackSshd, token: str, *, wrap: bool
) -> tuple[subprocess.Popen[bytes], list[ProcessIdentity]]:
    """`ssh -tt eog-a 'exec [exec wrapper] python -c RANK'`, as mlx.launch starts a rank.

    The rank ignores SIGHUP and SIGTERM. Returns the ssh client and [rank, wrapper?].
    """
    code = (
        f"import os, signal, time  # {token}\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('rank', os.getpid(), os.getppid(), flush=True)\n"
        "time.sleep(3600)\n"
    )
    wrapper = [*cli.CLI, "exec", "--stdin-hup", "--grace", "0.5", "--"] if wrap else []
    remote = "exec " + shlex.join([*wrapper, sys.executable, "-c", code])
    client = subprocess.Popen(
        cluster.ssh_argv("-tt", "eog-a", remote),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert client.stdout is not None
    pending = b""
    deadline = time.monotonic() + 30
    while (found := re.search(rb"rank (\d+) (\d+)", pending)) is None:
        ready, _, _ = select.select([client.stdout], [], [], max(0, deadline - time.monotonic()))
        chunk = os.read(client.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            client.kill()
            client.wait()
            raise AssertionError(f"the rank did not start over ssh: {pending!r}")
        pending += chunk
    pids = [int(found.group(1)), *([int(found.group(2))] if wrap else [])]
    identities = [identity_of(pid) for pid in pids]
    assert all(identity is not None for identity in identities)
    return client, [identity for identity in identities if identity is not None]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def command_name(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip()


@pytest.fixture
def planted() -> Iterator[list[ProcessIdentity]]:
    processes: list[ProcessIdentity] = []
    yield processes
    for identity in scenarios.alive(processes):
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, signal.SIGCONT)
            os.kill(identity.pid, signal.SIGKILL)
    scenarios.wait_gone(processes, 5.0)


@pytest.mark.parametrize("wrap", [True, False], ids=["wrapped", "control-unwrapped"])
def test_a_rank_deaf_to_sighup_dies_with_its_ssh_session_only_when_wrapped(
    cluster: sshd.LoopbackSshd, token: str, planted: list[ProcessIdentity], wrap: bool
) -> None:
    client, ranks = start_rank_over_ssh(cluster, token, wrap=wrap)
    planted.extend(ranks)
    session = parent_of(ranks[-1].pid)
    assert command_name(session).startswith("sshd")
    client.kill()  # the launcher dies; the healthy sshd closes the session's pty
    client.wait()
    exits = scenarios.wait_gone(ranks, 2.0)
    if wrap:
        assert all(seen is not None for seen in exits.values()), "the wrapped rank survived"
    else:
        time.sleep(0.5)
        assert scenarios.alive(ranks) == ranks, "the control should outlive its session"


def test_a_rank_behind_a_stuck_sshd_is_found_and_swept_over_ssh(
    cluster: sshd.LoopbackSshd, token: str, planted: list[ProcessIdentity]
) -> None:
    client, ranks = start_rank_over_ssh(cluster, token, wrap=True)
    planted.extend(ranks)
    session = identity_of(parent_of(ranks[-1].pid))
    assert session is not None
    planted.append(session)
    # A stuck sshd (state U on a Mac) neither exits nor closes the pty: the wrapper
    # sees its parent alive and its stdin open.
    os.kill(session.pid, signal.SIGSTOP)
    client.kill()
    client.wait()
    time.sleep(0.5)
    assert scenarios.alive(ranks) == ranks

    code, document = hosts_json(
        cluster, "scan", "--hosts", "eog-a", "--registry-only", "--match", token, "--any-parent"
    )
    suspects = by_host(document)["eog-a"]["report"]["suspects"]
    assert code == 1
    # Besides them: the wrapper's watchdog (a fork, same command line) and, with some
    # login shells, subshells their rc files forked from `bash -c '... TOKEN'`.
    assert {rank.pid for rank in ranks} <= {suspect["pid"] for suspect in suspects}
    assert all(token in " ".join(suspect["argv"]) for suspect in suspects), json.dumps(suspects)
    assert {suspect["rule"] for suspect in suspects} == {"match-any-parent"}

    # Both hosts are this machine: their sweeps take turns on the registry lock.
    code, document = hosts_json(
        cluster,
        "sweep",
        "--hosts",
        "eog-a,eog-b",
        "--registry-only",
        "--match",
        token,
        "--any-parent",
    )
    assert code == 0, document
    assert all(seen is not None for seen in scenarios.wait_gone(ranks, 2.0).values())
    assert scenarios.alive([session]) == [session], "the sshd itself is not matched"
