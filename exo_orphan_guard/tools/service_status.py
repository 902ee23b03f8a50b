"""What `service status` and `doctor`'s `guardian` line say: whether the guardian is
installed, whether it runs, and what it has ended since boot.

It runs when `guardian.json` in the user's guardian directory (`user_dir`) names a
live process of this boot (`guardian_state.running`: pid and start, never the pid alone); its lock
alone, held without a state file, is a guardian starting, not one running yet. One
that does not run is told apart by what is there: no registry, a registry it cannot
use (an installed guardian then waits for it, guarding nothing), no `guardian.json`,
or one naming a process that is gone. On Linux, whether systemd keeps the user's
manager after the last logout (lingering) says whether an installed guardian does.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from ..records import guardian_state
from ..records.endings import Ending
from ..records.guardian_state import GuardianState
from .check import Check
from .service_control import FileState, Job
from .service_files import Manager, file_path

NAME: Final = "guardian"
INSTALL: Final = "exo-orphan-guard service install"
STATUS: Final = "exo-orphan-guard service status"
SCHEMA: Final = "exo-orphan-guard/service-status/1"
ENABLE_LINGER: Final = "sudo loginctl enable-linger $USER"
LINGER_MEANS: Final = (
    "systemd stops the guardian when the user's last session ends (logout, the last ssh) "
    "and starts it at the next login, while an exo started in tmux or under nohup runs "
    "on, unguarded"
)
LINGER_OFF: Final = f"systemd lingering is off for this user: {LINGER_MEANS}"
REGISTRY_FIX: Final = (
    "fix the registry's owner and mode (yours, 700), or set EXO_ORPHAN_GUARD_DIR to a "
    "directory of your own and install again"
)
RECHECKS: Final = "re-checks it every minute at most, and guards once it can use it"
WAITING: Final = f"an installed guardian waits for it, guarding nothing, {RECHECKS}"


@final
@dataclass(frozen=True, slots=True)
class GuardianFacts:
    manager: Manager | None
    """None: this OS has neither launchd nor systemd."""
    installed: Path | None
    """The LaunchAgent or unit file, if there is one."""
    running: GuardianState | None
    lock_held: bool | None
    directory: Path | None
    """The user's guardian directory (`user_dir`), where the guardian keeps its lock and
    state; None: there is none yet."""
    ended: tuple[Ending, ...]
    """The guardian's own `ended` lines since boot, one per runner."""
    registry_problem: str | None = None
    """Why the registry, or the guardian directory, cannot be used."""
    last: GuardianState | None = None
    """What `guardian.json` says, the process alive or not."""
    state_file: bool = False
    """Whether there is a `guardian.json` at all."""
    boot_id: str = ""
    """This boot's (what `last` is told apart by)."""
    linger: bool | None = None
    """systemd: whether the user's manager outlives the last session; None: not
    systemd, or not known."""


@final
@dataclass(frozen=True, slots=True)
class StatusReport:
    """`service status`: the facts, and what the service manager says."""

    facts: GuardianFacts
    file_state: FileState
    job: Job | None
    job_problem: str | None
    """Why the manager could not be asked (its tool missing, no user session)."""
    logs: str | None
    """Where the installed guardian's output goes."""

    @property
    def exit_code(self) -> int:
        return 0 if self.facts.running is not None else 1


def read(
    manager: Manager | None,
    installed: Path | None,
    directory: Path | None,
    boot_id: str,
    seen: Sequence[Ending],
    *,
    registry_problem: str | None = None,
    linger: bool | None = None,
) -> GuardianFacts:
    """The facts, from this boot's endings (`seen`) and the files in the guardian
    `directory`."""
    state_file = directory is not None and (directory / guardian_state.STATE_NAME).exists()
    return GuardianFacts(
        manager=manager,
        installed=installed,
        running=None if directory is None else guardian_state.running(directory, boot_id),
        lock_held=False if directory is None else guardian_state.is_held(directory),
        directory=directory,
        ended=ended_by_guardian(seen),
        registry_problem=registry_problem,
        last=None if directory is None else guardian_state.read_state(directory),
        state_file=state_file,
        boot_id=boot_id,
        linger=linger,
    )


def installed_here(manager: Manager | None, home: Path, environ: Mapping[str, str]) -> Path | None:
    """The service file `install` writes, if there is one."""
    if manager is None:
        return None
    path = file_path(manager, home, environ)
    return path if path.is_file() else None


def ended_by_guardian(seen: Sequence[Ending]) -> tuple[Ending, ...]:
    found = {e.identity: e for e in seen if e.event == "ended" and e.by == "guardian"}
    return tuple(found.values())


def endings_summary(ended: Sequence[Ending]) -> str:
    """E.g. `3 runner(s) since boot: 2 clean (interrupt 2), 1 killed (grace 1)`."""
    if not ended:
        return "none since boot"
    parts: list[str] = []
    for how in ("clean", "killed"):
        steps = Counter(ending.step or "step unknown" for ending in ended if ending.how == how)
        if steps:
            counted = ", ".join(f"{step} {count}" for step, count in sorted(steps.items()))
            parts.append(f"{steps.total()} {how} ({counted})")
    return f"{len(ended)} runner(s) since boot: {', '.join(parts)}"


def check(facts: GuardianFacts) -> Check:
    """`doctor`'s line."""
    figures = {
        "installed": facts.installed is not None,
        "running": facts.running is not None,
        "pid": None if facts.running is None else facts.running.pid,
        "ended": len(facts.ended),
        "killed": sum(ending.how == "killed" for ending in facts.ended),
        "linger": facts.linger,
    }
    ended = f"ended {endings_summary(facts.ended)}"
    linger_off = facts.installed is not None and facts.linger is False
    linger = f"; {LINGER_OFF}" if linger_off else ""
    if facts.running is not None:
        if linger_off:
            detail = f"{_running(facts.running)}; {ended}{linger}"
            return Check(NAME, "WARN", detail, ENABLE_LINGER, figures)
        keep = None if facts.installed is not None or facts.manager is None else INSTALL
        return Check(NAME, "OK", f"{_running(facts.running)}; {ended}", keep, figures)
    if facts.registry_problem is not None:
        waits = f"; {WAITING}" if facts.installed is not None else ""
        detail = f"not guarding: it cannot use the registry ({facts.registry_problem}){waits}"
        return Check(NAME, "WARN", detail, REGISTRY_FIX, figures)
    starting = "; a process holds its lock, starting" if facts.lock_held else ""
    if facts.installed is not None:
        detail = f"installed ({facts.installed}) but not running{starting}; {ended}{linger}"
        return Check(NAME, "WARN", detail, f"{STATUS} (says why, and where its log is)", figures)
    if facts.manager is None:
        detail = f"not running{starting}; no launchd or systemd here to keep one running"
        return Check(NAME, "WARN", detail, "exo-orphan-guard service run", figures)
    return Check(NAME, "WARN", f"not installed, not running{starting}", INSTALL, figures)


def render(report: StatusReport) -> str:
    facts = report.facts
    lines = [f"installed: {_installed(report)}"]
    if facts.linger is False and facts.installed is not None:
        lines.append(f"lingering: off: {LINGER_MEANS}")
    if facts.running is not None:
        lines.append(f"running:   yes, {_running(facts.running)}")
    else:
        lines.append(f"running:   no ({_not_running(facts)})")
        if facts.registry_problem is not None and report.job is not None and report.job.active:
            waits = f"its service is up: the guardian waits for it, guarding nothing, {RECHECKS}"
            lines.append(f"waiting:   {waits}")
    lines.append(f"ended:     {endings_summary(facts.ended)}")
    if facts.running is None:
        if facts.registry_problem is not None:
            lines.append(f"-> {REGISTRY_FIX}")
        elif facts.manager is None:
            lines.append("-> exo-orphan-guard service run")
        else:
            advice = f"-> {INSTALL}" if facts.installed is None else f"-> its log: {report.logs}"
            lines.append(advice)
    if facts.linger is False and facts.installed is not None:
        lines.append(f"-> {ENABLE_LINGER}")
    return "\n".join(lines)


def _not_running(facts: GuardianFacts) -> str:
    held = "; a process holds its lock, starting" if facts.lock_held else ""
    if facts.registry_problem is not None:
        return f"it cannot use the registry: {facts.registry_problem}"
    if facts.directory is None:
        return "no guardian directory here yet: no guardian has run"
    state = facts.directory / guardian_state.STATE_NAME
    if not facts.state_file:
        return (
            f"no {state}: none runs, and none has since it was made or the last one stopped{held}"
        )
    if facts.last is None:
        return f"{state} cannot be read or is not to be trusted{held}"
    if facts.last.boot_id != facts.boot_id:
        return f"{state} is from an earlier boot: none has run since this one{held}"
    return f"{state} names pid {facts.last.pid}, which is gone: it was killed, or it crashed{held}"


def to_json(report: StatusReport) -> str:
    facts, job, running = report.facts, report.job, report.facts.running
    steps = Counter(f"{e.how}/{e.step}" for e in facts.ended)
    document = {
        "schema": SCHEMA,
        "manager": facts.manager,
        "file": None if facts.installed is None else str(facts.installed),
        "installed": facts.installed is not None,
        "file_current": report.file_state == "same",
        "job": None if job is None else {"enabled": job.enabled, "active": job.active},
        "job_problem": report.job_problem,
        "running": running is not None,
        "guardian": None
        if running is None
        else {
            "pid": running.pid,
            "since": running.since,
            "mode": running.mode,
            "version": running.version,
        },
        "lock_held": facts.lock_held,
        "directory": None if facts.directory is None else str(facts.directory),
        "registry_problem": facts.registry_problem,
        "linger": facts.linger,
        "ended": {
            "runners": len(facts.ended),
            "clean": sum(e.how == "clean" for e in facts.ended),
            "killed": sum(e.how == "killed" for e in facts.ended),
            "steps": dict(sorted(steps.items())),
        },
        "logs": report.logs,
    }
    return json.dumps(document, indent=2)


def _running(state: GuardianState) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.since))
    return f"pid {state.pid} since {since} ({state.mode} mode, version {state.version})"


def _installed(report: StatusReport) -> str:
    facts = report.facts
    if facts.manager is None:
        return "no (no launchd or systemd on this system)"
    if facts.installed is None:
        return "no"
    stale = report.file_state == "different"
    again = "; not what `install` would write from here" if stale else ""
    if report.job is None:
        said = f"not asked: {report.job_problem}"
    elif facts.manager == "launchd":
        said = f"loaded in {report.job.where}" if report.job.active else "not loaded"
    else:
        enabled = "enabled" if report.job.enabled else "not enabled"
        said = f"{enabled}, {'active' if report.job.active else 'inactive'}"
    return f"yes, {facts.installed} ({said}{again})"
