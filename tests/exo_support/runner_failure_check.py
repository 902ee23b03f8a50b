"""Does exo's REAL RunnerSupervisor explain a known runner failure and sweep at once?

Run it with the python of an environment made by ``scripts/exo-venv <tree> <cache>``
for a tree patched with ``exo-orphan-guard patch apply --exo <tree>``, in which
``import exo_orphan_guard`` works (a ``.pth`` in the venv's site-packages, say)::

    <venv>/bin/python tests/exo_support/runner_failure_check.py --version main
    <venv>/bin/python tests/exo_support/runner_failure_check.py --version v1.0.71

What it does:

1. With EXO_ORPHAN_GUARD=1 and EXO_ORPHAN_GUARD_DIR=<temp dir> set before exo is
   imported, adds a loguru sink that keeps every message, and calls the patched
   ``orphan_guard.prepare_worker()`` (as ``Worker.run`` does).
2. Plants an orphan the sweep must kill: the venv's python with
   ``--multiprocessing-fork`` in argv, detached so that its parent is init.
3. Builds exo's real ``RunnerSupervisor.create(...)`` for exo's own fixture
   ``get_bound_mlx_ring_instance`` on an in-process ``channel`` (the worker's event
   channel), and never starts its runner (so no mlx). Then injects a failure
   through the real code path, inside the supervisor's own task group ``_tg``,
   which ``run()`` enters before anything else (see ``inject_*`` for why):

   - main: ``_check_runner(RunnerTerminationError.from_exception(ValueError(...)))``
     (the object a crashing runner sends), run as a task in ``_tg``;
   - v1.0.71: ``_forward_events`` runs as a task in ``_tg``; from the runner's side
     (the ``mp_channel`` sender ``create`` put in the runner process's args) comes
     ``RunnerStatusUpdated(RunnerFailed(error_message=...))``, then the sender is
     closed, as exo's runner ``entrypoint`` does after a crash.

   First with "[jaccl] Changing queue pair to RTR failed with errno 16" (known),
   then, on a fresh supervisor, with an unknown "ValueError: something else".

Prints ONE JSON line on stdout::

    {"diagnosis_logged": ..., "orphan_killed": ..., "unrecognised_ignored": ...,
     "version": ...}

- ``diagnosis_logged``: after the known failure an "orphan guard: runner failed:"
  line was logged, and the supervisor reported the failure to the worker.
- ``orphan_killed``: the orphan is gone after the known failure AND the sweep logged
  "orphan guard: killed orphan <its pid>" (so a sweep of another test is no pass).
- ``unrecognised_ignored``: the unknown failure was reported to the worker, and no
  "orphan guard: runner failed" line came with it.

Exits 0 when all three are true, else 1. exo's logs and this script's notes go to
stderr. On an unpatched tree nothing diagnoses or sweeps: ``diagnosis_logged`` and
``orphan_killed`` are false, which is how the check fails. Every process started here
is killed on the way out.

Caveat (as for connect_to_group_check.py): the sweep is the real, machine-wide one.
It kills other orphaned exo-looking spawn children of this user, and another
test's sweep can kill our orphan first (then ``orphan_killed`` is false).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The shared set-up sits next to this script (stdlib and psutil only; nothing of exo
# is imported by it). No .pyc next to the sources.
sys.dont_write_bytecode = True
from check_setup import Planted, prepare_env, report_guard_wiring, start_orphan  # noqa: E402

VERSIONS = ("main", "v1.0.71")
KNOWN = "[jaccl] Changing queue pair to RTR failed with errno 16"
UNKNOWN = "ValueError: something else"
DIAGNOSIS = "orphan guard: runner failed"


def note(message: str) -> None:
    print(f"runner_failure_check: {message}", file=sys.stderr, flush=True)


@dataclass
class Phase:
    """What one injected failure produced."""

    logs: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    """error_message of every RunnerFailed the supervisor sent to the worker."""
    finished: bool = False


# --- exo ---------------------------------------------------------------------


def bound_instance() -> Any:
    from exo.shared.models.model_cards import ModelId
    from exo.shared.types.worker.instances import InstanceId
    from exo.shared.types.worker.runners import RunnerId
    from exo.worker.tests.constants import INSTANCE_1_ID, MODEL_A_ID, NODE_A, RUNNER_1_ID
    from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance

    return get_bound_mlx_ring_instance(
        instance_id=InstanceId(INSTANCE_1_ID),
        model_id=ModelId(MODEL_A_ID),
        runner_id=RunnerId(RUNNER_1_ID),
        node_id=NODE_A,
    )


def drain_reports(receiver: Any, phase: Phase) -> None:
    """Collect the RunnerFailed messages the supervisor sent to the worker so far."""
    import anyio
    from exo.shared.types.events import RunnerStatusUpdated
    from exo.shared.types.worker.runners import RunnerFailed

    while True:
        try:
            event = receiver.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return
        if isinstance(event, RunnerStatusUpdated) and isinstance(event.runner_status, RunnerFailed):
            phase.reported.append(event.runner_status.error_message or "")


def close_quietly(*ends: Any) -> None:
    for end in ends:
        with contextlib.suppress(Exception):
            end.close()


async def inject_main(message: str, timeout: float, phase: Phase) -> None:
    """main: the runner's RunnerTerminationError straight into ``_check_runner``.

    ``_check_runner`` ends with ``self.shutdown()`` = ``self._tg.cancel_tasks()``,
    which asserts that ``run()`` has entered ``_tg`` (AssertionError otherwise, right
    after the guard's hook). In exo ``_check_runner`` always runs while ``_tg`` is
    entered (from ``_forward_events``/``_watch_runner``, tasks of ``_tg``), so we
    enter ``_tg`` as ``run()`` does, only without ``runner_process.run`` and the
    stdio handler (they would start the real runner), and run ``_check_runner`` as a
    task in it. The never-started ``AsyncProcess`` needs nothing else: ``is_alive()``
    is False (no stop) and ``exitcode`` is None, so exo reports "exitcode=None".
    ``run()``'s own clean-up calls ``runner_process.stop()``, which raises for a
    never-started process, so we close the channels and log files ourselves.
    """
    import anyio
    from exo.shared.types.events import Event
    from exo.utils.channels import channel
    from exo.worker.runner.bootstrap import RunnerTerminationError
    from exo.worker.runner.supervisor import RunnerSupervisor

    event_sender, event_receiver = channel[Event]()
    supervisor = await RunnerSupervisor.create(
        bound_instance=bound_instance(), event_sender=event_sender
    )
    # str() of it reads "ValueError: <message>" (so UNKNOWN is not "ValueError: ValueError: ...")
    error = RunnerTerminationError.from_exception(ValueError(message.removeprefix("ValueError: ")))
    try:
        with anyio.move_on_after(timeout):
            async with supervisor._tg as tg:  # pyright: ignore[reportPrivateUsage]
                tg.start_soon(supervisor._check_runner, error)  # pyright: ignore[reportPrivateUsage]
            phase.finished = True
        drain_reports(event_receiver, phase)
    finally:
        runner_args = list(supervisor.runner_process._args)  # pyright: ignore[reportPrivateUsage]
        close_quietly(
            supervisor._ev_recv,  # pyright: ignore[reportPrivateUsage]
            supervisor._task_sender,  # pyright: ignore[reportPrivateUsage]
            supervisor._cancel_sender,  # pyright: ignore[reportPrivateUsage]
            *runner_args[1:4],  # the runner's ends: ev_send, task_recv, cancel_recv
            event_sender,
            event_receiver,
        )
        stdio = supervisor._runner_stdio_handler  # pyright: ignore[reportPrivateUsage]
        with anyio.CancelScope(shield=True):
            for log in (stdio._stdout_log, stdio._stderr_log):  # pyright: ignore[reportPrivateUsage]
                with contextlib.suppress(Exception):
                    await log.aclose()


async def inject_v1_0_71(message: str, timeout: float, phase: Phase) -> None:
    """v1.0.71: RunnerFailed from the runner's side through ``_forward_events``.

    ``create`` put the runner's end of the event channel (``ev_send``) into the
    never-started ``mp.Process``'s args; we act as that runner: send the failure,
    then close the sender, as exo's ``entrypoint`` does after a crash. We close only
    once the worker has received the forwarded failure: a closed MpSender sets a
    shared "closed" flag that makes the receiver raise ClosedResourceError *before*
    it reads what is still queued (exo's runner gets away with it because the
    supervisor is normally already blocked in ``get()``). The hook runs right after
    that forward, and the loop then sees the closed channel and calls
    ``_check_runner``, which ends in ``self.shutdown()``; as for main, that needs
    ``_tg`` entered as ``run()`` enters it, so ``_forward_events`` runs as a task of
    ``_tg`` (without ``_watch_runner``, which only polls the never-started process,
    and without ``runner_process.start()``). ``mp.Process`` never started:
    ``is_alive()`` False, ``exitcode`` None, so exo reports "exitcode=None".
    """
    import anyio
    from exo.shared.types.events import Event, RunnerStatusUpdated
    from exo.shared.types.worker.runners import RunnerFailed
    from exo.utils.channels import channel
    from exo.worker.runner.runner_supervisor import RunnerSupervisor

    event_sender, event_receiver = channel[Event]()
    supervisor = RunnerSupervisor.create(bound_instance=bound_instance(), event_sender=event_sender)
    runner_args = list(supervisor.runner_process._args)  # pyright: ignore[reportPrivateUsage]
    runner_ev_send = runner_args[1]
    failure = RunnerStatusUpdated(
        runner_id=supervisor.bound_instance.bound_runner_id,
        runner_status=RunnerFailed(error_message=message),
    )
    try:
        with anyio.move_on_after(timeout):
            async with supervisor._tg as tg:  # pyright: ignore[reportPrivateUsage]
                tg.start_soon(supervisor._forward_events)  # pyright: ignore[reportPrivateUsage]
                runner_ev_send.send(failure)
                while True:  # until the worker has the forwarded failure
                    event = await event_receiver.receive()
                    if isinstance(event, RunnerStatusUpdated) and isinstance(
                        event.runner_status, RunnerFailed
                    ):
                        phase.reported.append(event.runner_status.error_message or "")
                        break
                runner_ev_send.close()  # the runner exits; the supervisor winds down
            phase.finished = True
        drain_reports(event_receiver, phase)
    finally:
        close_quietly(
            supervisor._ev_recv,  # pyright: ignore[reportPrivateUsage]
            supervisor._task_sender,  # pyright: ignore[reportPrivateUsage]
            supervisor._cancel_sender,  # pyright: ignore[reportPrivateUsage]
            *runner_args[1:4],
            event_sender,
            event_receiver,
        )


async def run_phase(version: str, message: str, timeout: float, logs: list[str]) -> Phase:
    phase = Phase()
    start = len(logs)
    inject = inject_main if version == "main" else inject_v1_0_71
    try:
        await inject(message, timeout, phase)
    finally:
        phase.logs = logs[start:]
    if not phase.finished:
        note(f"the supervisor did not finish with {message!r} within {timeout:g} s")
    note(f"{message!r}: worker got RunnerFailed {phase.reported!r}")
    for line in phase.logs:
        if line.startswith("orphan guard"):
            note(f"  logged: {line[:160]}")
    return phase


def check(version: str, timeout: float) -> dict[str, Any]:
    import anyio

    result: dict[str, Any] = {
        "diagnosis_logged": False,
        "orphan_killed": False,
        "unrecognised_ignored": False,
        "version": version,
    }
    scratch = Path(tempfile.mkdtemp(prefix="exo-rfc-check-"))
    planted: list[Planted] = []
    try:
        prepare_env(scratch)  # EXO_ORPHAN_GUARD=1, EXO_ORPHAN_GUARD_DIR, XDG dirs
        from loguru import logger

        logs: list[str] = []
        logger.add(lambda message: logs.append(message.record["message"]), level="DEBUG")
        report_guard_wiring(note, unpatched="nothing will diagnose")

        orphan = start_orphan()
        planted.append(orphan)
        import psutil

        note(f"orphan pid {orphan.pid} (parent {psutil.Process(orphan.pid).ppid()})")
        if not orphan.alive():
            note("the orphan died before the failure was injected (another sweep?)")
            return result

        known = anyio.run(run_phase, version, KNOWN, timeout, logs)
        killed_line = f"orphan guard: killed orphan {orphan.pid} "
        result["diagnosis_logged"] = bool(known.reported) and any(
            line.startswith(DIAGNOSIS) for line in known.logs
        )
        result["orphan_killed"] = not orphan.alive() and any(
            line.startswith(killed_line) for line in known.logs
        )
        if not orphan.alive() and not result["orphan_killed"]:
            note("the orphan is gone, but not by this process's sweep")

        unknown = anyio.run(run_phase, version, UNKNOWN, timeout, logs)
        result["unrecognised_ignored"] = (
            unknown.finished
            and any("something else" in reported for reported in unknown.reported)
            and not any(DIAGNOSIS in line for line in unknown.logs)
        )
        return result
    except Exception:  # report all-false (exit 1) rather than no JSON at all
        traceback.print_exc()
        return result
    finally:
        for process in planted:
            try:
                process.kill()
            except Exception as error:
                note(f"cleanup of pid {process.pid} failed: {error!r}")
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", choices=VERSIONS, required=True)
    parser.add_argument("--timeout", type=float, default=30.0, help="per injected failure")
    args = parser.parse_args()

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through check()'s cleanup

    signal.signal(signal.SIGTERM, stop)
    result = check(args.version, args.timeout)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if all(value for key, value in result.items() if key != "version") else 1


if __name__ == "__main__":
    sys.exit(main())
