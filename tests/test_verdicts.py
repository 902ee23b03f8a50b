"""`decide` on made-up snapshots, for recorded runners: a runner of a dead worker is
killed with its group's leftovers, and every reason to spare one. What holds for every
process (other users, ourselves, the unreadable) is here too; the fingerprint and
`--match`, for runners nobody recorded, are in `test_verdicts_fingerprint.py`."""

from __future__ import annotations

import dataclasses
import re

from exo_orphan_guard.sweeper.verdicts import SweepOptions, decide
from tests.helpers.snapshots import (
    DEAD_WORKER,
    DEFAULT,
    ME,
    by_pid,
    member,
    proc,
    record,
    table,
)


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


def test_a_runner_gone_before_its_group_was_read_stays_recorded_whatever_its_worker_was() -> None:
    # The snapshot read the worker alive, then the runner gone: the worker died in
    # between and took the runner with it (PR_SET_PDEATHSIG). Its group is unread.
    worker = proc(200, argv=("/x/python", "-m", "exo"))
    verdicts = decide(table(worker, scanned=False), [record(300, DEAD_WORKER)], DEFAULT)
    assert [(verdict.action, verdict.again) for verdict in verdicts] == [("spare", True)]
