"""`decide` on made-up snapshots: every rule, every reason to spare."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from exo_orphan_guard.records.registry import LoadedRecord, RunnerRecord
from exo_orphan_guard.sweeper.process_table import ProcessInfo, ProcessTable
from exo_orphan_guard.sweeper.verdicts import SweepOptions, Verdict, decide
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid

ME = ProcessIdentity(Pid(100), 50.0)
UID = 501
BOOT = "boot-a"
EXO_PY = "/Users/me/exo/.venv/bin/python"
RUNNER_ARGV = (
    EXO_PY,
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(...)",
    "--multiprocessing-fork",
)
FROZEN_ARGV = (
    "/Applications/EXO.app/Contents/Resources/exo/exo",
    "--multiprocessing-fork",
    "tracker_fd=5",
    "pipe_handle=7",
)


def proc(
    pid: int,
    ppid: int = 1,
    *,
    argv: tuple[str, ...] = RUNNER_ARGV,
    exo: bool = True,
    uid: int = UID,
    started: float | None = None,
    status: str = "sleeping",
    pipes: frozenset[int] | None = None,
) -> ProcessInfo:
    return ProcessInfo(
        pid=Pid(pid),
        ppid=ppid,
        started=float(pid) if started is None else started,
        uid=uid,
        argv=argv,
        exe=argv[0] if argv else None,
        status=status,
        rss=2**30,
        create_time=1000.0 + pid,
        runs_exo=exo,
        pipes=pipes,
    )


def table(
    *processes: ProcessInfo,
    protected: tuple[int, ...] = (),
    unreadable: tuple[int, ...] = (),
    pipes_visible: bool = False,
    scanned: bool = True,
) -> ProcessTable:
    return ProcessTable(
        processes={process.pid: process for process in processes},
        me=ME,
        uid=UID,
        protected=frozenset((ME.pid, *protected)),
        boot_id=BOOT,
        taken_at=5000.0,
        unreadable=frozenset(unreadable),
        scanned_groups=frozenset(range(1000)) if scanned else frozenset(),
        pipes_visible=pipes_visible,
    )


def record(
    pid: int,
    worker: ProcessIdentity,
    *,
    started: float | None = None,
    argv: tuple[str, ...] = RUNNER_ARGV,
    uid: int = UID,
    boot: str = BOOT,
) -> LoadedRecord:
    runner = RunnerRecord(
        pid=Pid(pid),
        started=float(pid) if started is None else started,
        boot_id=boot,
        uid=uid,
        worker=worker,
        exe=argv[0],
        argv=argv,
        pgid=pid,
        recorded_at=1.0,
        labels={"runner_id": f"r{pid}"},
    )
    return LoadedRecord(Path(f"/registry/runner-{pid}.json"), runner)


DEAD_WORKER = ProcessIdentity(Pid(200), 200.0)
DEFAULT = SweepOptions()


def by_pid(verdicts: tuple[Verdict, ...]) -> dict[int, Verdict]:
    return {verdict.pid: verdict for verdict in verdicts if verdict.action != "forget"}


def test_recorded_runner_of_a_dead_worker_is_killed_with_its_labels() -> None:
    verdicts = by_pid(decide(table(proc(300)), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[300].action == "kill" and verdicts[300].rule == "registry"
    assert verdicts[300].labels == {"runner_id": "r300"}


def test_a_worker_pid_reused_by_another_process_counts_as_dead() -> None:
    impostor = proc(200, started=999.0, argv=("/bin/zsh",), exo=False)
    verdicts = by_pid(decide(table(proc(300), impostor), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[300].action == "kill"


def test_recorded_runner_of_a_live_worker_is_spared() -> None:
    worker = proc(200, argv=("/x/python", "-m", "exo"), exo=True)
    verdicts = by_pid(
        decide(table(proc(300, ppid=200), worker), [record(300, DEAD_WORKER)], DEFAULT)
    )
    assert verdicts[300].action == "spare" and "alive" in verdicts[300].reason


def test_a_zombie_worker_is_dead() -> None:
    worker = proc(200, status="zombie")
    verdicts = by_pid(decide(table(proc(300), worker), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[300].action == "kill"


def test_runners_of_the_calling_worker_are_spared() -> None:
    verdicts = by_pid(decide(table(proc(300)), [record(300, ME)], DEFAULT))
    assert verdicts[300].action == "spare" and verdicts[300].reason == "runner of this worker"


def test_pid_reuse_forgets_the_record_and_never_kills() -> None:
    stranger = proc(300, started=12345.0, argv=("/usr/bin/vim",), exo=False)
    verdicts = decide(table(stranger), [record(300, DEAD_WORKER)], DEFAULT)
    assert [(verdict.action, verdict.pid) for verdict in verdicts] == [("forget", 300)]
    assert "reuse" in verdicts[0].reason


def test_exited_runner_and_earlier_boot_records_are_forgotten() -> None:
    verdicts = decide(
        table(proc(301, status="zombie")),
        [record(300, DEAD_WORKER), record(301, DEAD_WORKER), record(302, DEAD_WORKER, boot="old")],
        DEFAULT,
    )
    assert sorted((verdict.pid, verdict.action) for verdict in verdicts) == [
        (300, "forget"),
        (301, "forget"),
        (302, "forget"),
    ]


def test_command_line_changed_since_recording_is_spared() -> None:
    exec_ed = proc(300, argv=("/usr/bin/ssh", "host"), exo=False)
    verdicts = by_pid(decide(table(exec_ed), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[300].action == "spare" and "not recognisably" in verdicts[300].reason


def test_other_users_processes_are_never_targets() -> None:
    foreign = proc(300, uid=0)
    verdicts = by_pid(decide(table(foreign), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[300].action == "spare" and "uid 0" in verdicts[300].reason
    foreign_unrecorded = by_pid(decide(table(proc(301, uid=0)), [], DEFAULT))
    assert foreign_unrecorded[301].action == "spare"
    matched = by_pid(
        decide(
            table(proc(302, uid=0)), [], SweepOptions(match=re.compile("spawn"), any_parent=True)
        )
    )
    assert matched[302].action == "spare"


def test_self_ancestors_and_descendants_are_never_targets() -> None:
    snapshot = table(proc(300), proc(301), protected=(300, 301))
    options = SweepOptions(match=re.compile("."), any_parent=True)
    verdicts = by_pid(decide(snapshot, [record(300, DEAD_WORKER)], options))
    assert {pid: verdict.action for pid, verdict in verdicts.items()} == {
        300: "spare",
        301: "spare",
    }


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


def test_unreadable_processes_are_never_taken_for_gone() -> None:
    # The runner's own pid unreadable: neither killed nor its record forgotten.
    verdicts = decide(table(), [record(300, DEAD_WORKER)], DEFAULT)
    assert [verdict.action for verdict in verdicts] == ["forget"]
    verdicts = decide(table(unreadable=(300,)), [record(300, DEAD_WORKER)], DEFAULT)
    assert [verdict.action for verdict in verdicts] == ["spare"]
    # The worker unreadable: it may be alive.
    verdicts = decide(table(proc(300), unreadable=(200,)), [record(300, DEAD_WORKER)], DEFAULT)
    assert [verdict.action for verdict in verdicts] == ["spare"]
    # The parent unreadable: it may be the spawner.
    verdicts = decide(table(proc(301, ppid=60), unreadable=(60,)), [], DEFAULT)
    assert [verdict.action for verdict in verdicts] == ["spare"]


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


def member(
    pid: int,
    pgid: int,
    *,
    started: float | None = None,
    marker: str | None = "300:300.0",
    readable: bool = True,
) -> ProcessInfo:
    process = proc(pid, argv=("/bin/sleep", "3600"), exo=False, started=started)
    return dataclasses.replace(process, pgid=pgid, runner_marker=marker, marker_readable=readable)


def test_leftovers_in_a_dead_runners_group_are_killed_once_its_worker_is_dead() -> None:
    verdicts = by_pid(decide(table(member(301, pgid=300)), [record(300, DEAD_WORKER)], DEFAULT))
    assert verdicts[301].action == "kill" and verdicts[301].rule == "registry-group"
    assert verdicts[301].labels == {"runner_id": "r300"}


def test_group_leftovers_of_a_live_worker_are_left_to_it() -> None:
    worker = proc(200, argv=("/x/python", "-m", "exo"))
    verdicts = by_pid(
        decide(table(member(301, pgid=300), worker), [record(300, DEAD_WORKER)], DEFAULT)
    )
    assert 301 not in verdicts


def test_a_reused_group_id_is_not_the_dead_runners_group() -> None:
    new_leader = proc(300, argv=("/usr/bin/make",), exo=False, started=9999.0)
    verdicts = by_pid(
        decide(table(new_leader, member(301, pgid=300)), [record(300, DEAD_WORKER)], DEFAULT)
    )
    assert 301 not in verdicts
    zombie_leader = dataclasses.replace(new_leader, status="zombie")
    verdicts = by_pid(
        decide(table(zombie_leader, member(301, pgid=300)), [record(300, DEAD_WORKER)], DEFAULT)
    )
    assert 301 not in verdicts


def test_group_members_need_proof_that_the_dead_runner_started_them() -> None:
    # The group's leader has gone and its id came back with a process that led a
    # group and left members (`cat f | less`, `setsid -f`): they carry no marker.
    cases = {
        301: member(301, pgid=300, marker=None),
        302: member(302, pgid=300, marker="300:12.0"),  # another runner's
        303: member(303, pgid=300, started=299.0),  # older than the runner
        304: member(304, pgid=300, readable=False),  # environment not readable
    }
    verdicts = by_pid(decide(table(*cases.values()), [record(300, DEAD_WORKER)], DEFAULT))
    assert {pid: verdicts[pid].action for pid in cases} == dict.fromkeys(cases, "spare")
    assert "cannot be read" in verdicts[304].reason


def test_a_runner_gone_before_its_group_was_read_keeps_its_record_for_another_pass() -> None:
    verdicts = decide(table(scanned=False), [record(300, DEAD_WORKER)], DEFAULT)
    assert [(verdict.action, verdict.again) for verdict in verdicts] == [("spare", True)]
    verdicts = decide(table(scanned=True), [record(300, DEAD_WORKER)], DEFAULT)
    assert [(verdict.action, verdict.again) for verdict in verdicts] == [("forget", False)]
