"""`decide` on made-up snapshots, for runners nobody recorded: the fingerprint of an
adopted exo spawn child, and `--match` with and without `--any-parent`."""

from __future__ import annotations

import dataclasses
import re

from exo_orphan_guard.sweeper.verdicts import SweepOptions, decide
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import (
    DEFAULT,
    EXO_PY,
    FROZEN_ARGV,
    by_pid,
    proc,
    record,
    table,
)


def test_unrecorded_exo_spawn_child_under_init_is_killed() -> None:
    verdicts = by_pid(
        decide(
            table(proc(300, ppid=1), proc(1, ppid=0, argv=("/sbin/launchd",), exo=False)),
            [],
            DEFAULT,
        )
    )
    assert verdicts[300].action == "kill" and verdicts[300].rule == "fingerprint"


def test_frozen_app_runner_adopted_by_a_subreaper_holding_none_of_its_pipes_is_killed() -> None:
    subreaper = proc(50, argv=("/usr/lib/systemd/systemd", "--user"), exo=False, pipes=frozenset())
    orphan = proc(300, ppid=50, argv=FROZEN_ARGV, pipes=frozenset({7001, 7002}))
    verdicts = by_pid(decide(table(orphan, subreaper, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "kill" and "subreaper" in verdicts[300].reason


def test_a_live_parent_holding_a_pipe_of_the_child_is_its_spawner_whatever_it_runs() -> None:
    # `python worker.py` from an activated venv: argv[0] is relative, exe() the base
    # interpreter, so nothing says "exo" about the worker. It is alive: spare.
    worker = proc(200, argv=("python", "worker.py"), exo=False, pipes=frozenset({7001, 9}))
    runner = proc(300, ppid=200, pipes=frozenset({7001}))
    verdicts = by_pid(decide(table(runner, worker, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "spare" and "alive" in verdicts[300].reason


def test_a_fork_of_a_live_runner_is_not_an_adopted_spawn_child() -> None:
    # A runner's watchdog is forked: same command line, and it holds none of the
    # runner's pipes (it closes them all).
    runner = proc(300, ppid=200, pipes=frozenset({7001}))
    watchdog = proc(301, ppid=300, pipes=frozenset())
    worker = proc(200, argv=("python", "worker.py"), exo=False, pipes=frozenset({7001}))
    verdicts = by_pid(decide(table(runner, watchdog, worker, pipes_visible=True), [], DEFAULT))
    assert verdicts[301].action == "spare"


def test_a_watchdog_that_took_over_is_spared_while_its_runner_lives() -> None:
    """The understudy that took over from a dead watchdog is init's, with the runner's
    command line: in the group its live runner leads, it is no orphan."""
    runner = dataclasses.replace(proc(300, ppid=200, pipes=frozenset({7001})), pgid=300)
    took_over = dataclasses.replace(proc(302, ppid=1, pipes=frozenset()), pgid=300)
    worker = proc(200, argv=("python", "worker.py"), exo=False, pipes=frozenset({7001}))
    verdicts = by_pid(decide(table(runner, took_over, worker, pipes_visible=True), [], DEFAULT))
    assert verdicts[302].action == "spare" and "runner 300" in verdicts[302].reason
    # Its runner gone (exited, or not leading the group, or another command line):
    # the rule says nothing, and the fingerprint judges it as before.
    for leader in (
        dataclasses.replace(runner, status="zombie"),
        dataclasses.replace(runner, pgid=200),
        dataclasses.replace(runner, argv=("python", "other.py", "--multiprocessing-fork")),
    ):
        verdicts = by_pid(decide(table(leader, took_over, pipes_visible=True), [], DEFAULT))
        assert verdicts[302].action == "kill", leader


def test_exo_as_a_containers_pid_1_keeps_its_runners() -> None:
    exo_init = proc(1, ppid=0, argv=("python", "-m", "exo"), exo=False, pipes=frozenset({5}))
    runner = proc(300, ppid=1, pipes=frozenset({5}))
    verdicts = by_pid(decide(table(runner, exo_init, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "spare"


def test_unreadable_pipes_spare_the_child_of_a_live_python_parent() -> None:
    parent = proc(50, argv=("python", "worker.py"), exo=False, pipes=None)
    runner = proc(300, ppid=50, pipes=frozenset({7001}))
    verdicts = by_pid(decide(table(runner, parent, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "spare"
    unknown = dataclasses.replace(parent, argv=())
    verdicts = by_pid(decide(table(runner, unknown, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "spare"


def test_unreadable_pipes_of_a_program_that_runs_no_python_prove_adoption() -> None:
    # An init whose descriptors root cannot read (a sandbox's pid 1), or tini.
    for argv in (("/process_api", "--firecracker-init"), ("/usr/bin/tini", "--")):
        init = proc(1, ppid=0, argv=argv, exo=False, pipes=None)
        runner = proc(300, ppid=1, pipes=frozenset({7001}))
        verdicts = by_pid(decide(table(runner, init, pipes_visible=True), [], DEFAULT))
        assert verdicts[300].action == "kill" and "not a Python program" in verdicts[300].reason


def test_a_parent_of_another_user_cannot_be_the_spawner() -> None:
    init = proc(1, ppid=0, argv=("/sbin/init",), exo=False, uid=0, pipes=None)
    runner = proc(300, ppid=1, pipes=frozenset({7001}))
    verdicts = by_pid(decide(table(runner, init, pipes_visible=True), [], DEFAULT))
    assert verdicts[300].action == "kill" and "uid 0" in verdicts[300].reason


def test_without_visible_pipes_only_init_counts_as_adoption() -> None:
    launchd = proc(1, ppid=0, argv=("/sbin/launchd",), exo=False)
    worker = proc(200, argv=("python", "worker.py"), exo=False)
    under_init = proc(300, ppid=1)
    under_worker = proc(301, ppid=200)
    verdicts = by_pid(decide(table(under_init, under_worker, launchd, worker), [], DEFAULT))
    assert verdicts[300].action == "kill"
    assert verdicts[301].action == "spare"


def test_unrecorded_spawn_child_of_a_live_exo_process_is_spared() -> None:
    exo_main = proc(200, argv=(EXO_PY, "/Users/me/exo/.venv/bin/exo"))
    verdicts = by_pid(decide(table(proc(300, ppid=200), exo_main), [], DEFAULT))
    assert verdicts[300].action == "spare"


def test_another_exo_orphan_guard_is_never_a_target() -> None:
    options = SweepOptions(match=re.compile("rank"), any_parent=True)
    for argv in (
        ("/venv/bin/exo-orphan-guard", "sweep", "--match", "rank", "--any-parent"),
        ("/usr/bin/python3", "/venv/bin/exo-orphan-guard", "sweep", "--match", "rank"),
        ("python3", "-I", "-m", "exo_orphan_guard", "sweep", "--match", "rank"),
        ("ssh", "-o", "BatchMode=yes", "h1", "exo-orphan-guard sweep --match rank"),
    ):
        verdicts = by_pid(decide(table(proc(300, argv=argv, exo=False)), [], options))
        assert verdicts[300].action == "spare" and "exo-orphan-guard" in verdicts[300].reason
    rank = proc(301, argv=("python3", "-m", "rank"), exo=False)
    assert by_pid(decide(table(rank), [], options))[301].action == "kill"


def test_all_users_lets_root_target_other_users_unrecorded_runners() -> None:
    foreign = proc(300, uid=0)
    assert by_pid(decide(table(foreign), [], DEFAULT))[300].action == "spare"
    verdicts = by_pid(decide(table(foreign), [], SweepOptions(all_users=True)))
    assert verdicts[300].action == "kill"


def test_spawn_children_of_other_programs_are_not_ours() -> None:
    jupyter_child = proc(
        300, ppid=1, argv=("/usr/bin/python3", "-c", "...", "--multiprocessing-fork"), exo=False
    )
    plain = proc(301, ppid=1, argv=("/bin/sleep", "100"), exo=False)
    assert decide(table(jupyter_child, plain), [], DEFAULT) == ()


def test_resource_tracker_is_not_a_runner() -> None:
    tracker = proc(
        300,
        ppid=1,
        argv=(EXO_PY, "-c", "from multiprocessing.resource_tracker import main;main(6)"),
    )
    assert decide(table(tracker), [], DEFAULT) == ()


def test_fingerprint_off_ignores_unrecorded_runners() -> None:
    assert decide(table(proc(300, ppid=1)), [], SweepOptions(fingerprint=False)) == ()


def test_match_kills_reparented_and_spares_live_parented_without_any_parent() -> None:
    sshd = proc(40, ppid=1, argv=("sshd: me@notty",), exo=False)
    rank_orphan = proc(300, ppid=1, argv=("/opt/py/bin/python", "rank.py"), exo=False)
    rank_stuck = proc(301, ppid=40, argv=("/opt/py/bin/python", "rank.py"), exo=False)
    options = SweepOptions(match=re.compile(r"rank\.py"))
    verdicts = by_pid(decide(table(sshd, rank_orphan, rank_stuck), [], options))
    assert verdicts[300].action == "kill" and verdicts[300].rule == "match"
    assert verdicts[301].action == "spare" and "--any-parent" in verdicts[301].reason
    assert 40 not in verdicts


def test_match_with_any_parent_kills_under_a_live_sshd() -> None:
    sshd = proc(40, ppid=1, argv=("sshd: me@notty",), exo=False)
    rank = proc(301, ppid=40, argv=("/opt/py/bin/python", "rank.py"), exo=False)
    options = SweepOptions(match=re.compile(r"rank\.py"), any_parent=True)
    verdicts = by_pid(decide(table(sshd, rank), [], options))
    assert verdicts[301].action == "kill" and verdicts[301].rule == "match-any-parent"


def test_match_never_kills_a_guard_query_nor_the_ssh_carrying_one() -> None:
    # `sweep --hosts` reaching this very host: the regex is in its argv and its ssh's.
    local = proc(
        300, ppid=40, argv=("/v/bin/python", "/v/bin/exo-orphan-guard", "sweep", "--match", "tok")
    )
    module = proc(301, ppid=40, argv=("python3", "-m", "exo_orphan_guard", "scan", "tok"))
    ssh = proc(
        302,
        ppid=300,
        argv=("ssh", "-o", "BatchMode=yes", "--", "h1", "exo-orphan-guard sweep --match tok"),
    )
    # An `exec` wrapper is judged like a runner: named by --match, it goes.
    wrapped = proc(
        303, ppid=1, argv=("/v/bin/exo-orphan-guard", "exec", "--", "python3", "tok", "sweep")
    )
    rank = proc(304, ppid=1, argv=("python3", "tok.py", "--sweep"))
    command = proc(305, ppid=303, argv=("python3", "tok", "sweep"), exo=False)
    options = SweepOptions(match=re.compile("tok"), any_parent=True)
    verdicts = by_pid(decide(table(local, module, ssh, wrapped, rank, command), [], options))
    assert {pid: verdict.action for pid, verdict in verdicts.items()} == {
        300: "spare",
        301: "spare",
        302: "spare",
        303: "kill",
        304: "kill",
        305: "kill",
    }


def test_match_any_parent_kills_a_recorded_wrapper_whose_parent_lives() -> None:
    # `exec` under a stuck sshd: its recorded worker (the sshd) is alive.
    sshd = proc(200, argv=("sshd: me@pts/0",), exo=False)
    wrapper_argv = ("/v/bin/exo-orphan-guard", "exec", "--", "python3", "rank.py")
    recorded = record(300, ProcessIdentity(Pid(200), 200.0), argv=wrapper_argv)
    snapshot = table(sshd, proc(300, ppid=200, argv=wrapper_argv, exo=False))
    spared = by_pid(decide(snapshot, [recorded], SweepOptions(match=re.compile("rank"))))
    assert spared[300].action == "spare"
    options = SweepOptions(match=re.compile("rank"), any_parent=True)
    killed = by_pid(decide(snapshot, [recorded], options))
    assert killed[300].action == "kill" and killed[300].rule == "match-any-parent"
    other = SweepOptions(match=re.compile("other"), any_parent=True)
    assert by_pid(decide(snapshot, [recorded], other))[300].action == "spare"


def test_a_recorded_verdict_is_not_judged_twice_by_the_fingerprint() -> None:
    worker = proc(200, argv=("/x/python", "-m", "exo"), exo=True)
    verdicts = decide(
        table(proc(300, ppid=1), worker), [record(300, ProcessIdentity(Pid(200), 200.0))], DEFAULT
    )
    assert [(verdict.pid, verdict.action) for verdict in verdicts] == [(300, "spare")]


def test_an_init_sharing_the_runners_stdout_is_not_its_spawner() -> None:
    """Issue 40 item 4: `sh`, `tini` or `dumb-init` as a container's pid 1 holds the
    stdout every v1.0.71 runner inherits. A shared pipe is no proof of spawning: a
    spawner is a Python program (or the frozen app the child runs)."""
    for argv in (("/bin/sh", "-c", "while :; do sleep 1; done"), ("/usr/bin/dumb-init", "--")):
        init = proc(1, ppid=0, argv=argv, exo=False, pipes=frozenset({5, 6}))
        runner = proc(300, ppid=1, pipes=frozenset({5, 7001}))
        verdict = by_pid(decide(table(runner, init, pipes_visible=True), [], DEFAULT))[300]
        assert verdict.action == "kill", argv
        assert "not a Python program" in verdict.reason
