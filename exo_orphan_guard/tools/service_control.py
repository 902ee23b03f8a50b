"""launchctl and systemctl for `service install | uninstall | status`: what to run is
decided by pure functions of what the manager says; running it goes through an
injected command runner (tests give a fake one, and a fake `which`).

launchd: `launchctl enable` then `bootstrap` into the user's GUI domain (`gui/<uid>`;
`user/<uid>` where no one is logged in at the screen, over ssh), `bootout` to stop, as
`brew services` does. systemd: a user unit, `daemon-reload` and `enable --now`;
`disable --now` to stop; `loginctl` says whether the user's manager outlives the
user's last session (lingering).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from .service_files import LABEL, UNIT_NAME, Manager

Command = tuple[str, ...]
FileState = Literal["absent", "same", "different"]
TIMEOUT_SECONDS: Final = 30.0
_SETTLE_SECONDS: Final = 5.0
_SESSION_STATES: Final = frozenset(
    {"running", "degraded", "starting", "initializing", "maintenance", "stopping"}
)
"""What `systemctl --user is-system-running` answers where a user manager runs
(`offline`, or no answer: none does)."""
_SYSTEMCTL: Final = ("systemctl", "--user")


@final
@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    output: str
    """Standard output and error together, stripped."""


Run = Callable[[Command], Completed]
Which = Callable[[str], str | None]


@final
@dataclass(frozen=True, slots=True)
class Job:
    """What the manager says of the guardian's job."""

    enabled: bool
    """systemd: enabled (started at login); launchd: loaded in the domain."""
    active: bool
    """systemd: active; launchd: loaded (KeepAlive restarts it while it is)."""
    where: str
    """The launchd domain or `systemd --user`."""


@final
@dataclass(frozen=True, slots=True)
class Plan:
    before: tuple[Command, ...]
    file: Literal["write", "remove", "keep"]
    after: tuple[Command, ...]

    @property
    def commands(self) -> tuple[Command, ...]:
        return self.before + self.after


def _tool(manager: Manager) -> str:
    return "launchctl" if manager == "launchd" else "systemctl"


def install_plan(manager: Manager, state: FileState, job: Job, plist: Path) -> Plan:
    """What makes the installed file this one and its job run, and nothing more."""
    if manager == "launchd":
        target = (f"{job.where}/{LABEL}",)
        load = (
            ("launchctl", "enable", *target),
            ("launchctl", "bootstrap", job.where, str(plist)),
        )
        if job.active and state == "same":
            return Plan((), "keep", ())
        unload = (("launchctl", "bootout", *target),) if job.active else ()
        return Plan(unload, "write" if state != "same" else "keep", load)
    if state == "same":
        return Plan((), "keep", () if job.enabled and job.active else (_unit("enable", "--now"),))
    # A running guardian reads its unit only when started again.
    start = (_unit("enable"), _unit("restart")) if job.active else (_unit("enable", "--now"),)
    return Plan((), "write", ((*_SYSTEMCTL, "daemon-reload"), *start))


def uninstall_plan(manager: Manager, present: bool, job: Job) -> Plan:
    removal: Literal["remove", "keep"] = "remove" if present else "keep"
    if manager == "launchd":
        unload = (("launchctl", "bootout", f"{job.where}/{LABEL}"),) if job.active else ()
        return Plan(unload, removal, ())
    stop = (_unit("disable", "--now"),) if job.enabled or job.active else ()
    return Plan(stop, removal, ((*_SYSTEMCTL, "daemon-reload"),) if present else ())


def fresh_install_plan(manager: Manager, uid: int, plist: Path) -> Plan:
    """What `install` runs where nothing is installed (for `--print`, which asks no one)."""
    return install_plan(manager, "absent", Job(False, False, f"gui/{uid}"), plist)


def _unit(*words: str) -> Command:
    return (*_SYSTEMCTL, *words, UNIT_NAME)


def session_problem(manager: Manager, run: Run, which: Which) -> str | None:
    """Why the manager cannot be asked here (its tool missing, no user session), as
    the end of a sentence, or None."""
    name = _tool(manager)
    if which(name) is None:
        return f"{name} is not on PATH"
    if manager == "launchd":
        return None
    answer = run((*_SYSTEMCTL, "is-system-running"))
    said = answer.output.splitlines()[0].strip() if answer.output else ""
    if said in _SESSION_STATES:
        return None
    return (
        f"systemctl --user has no user session here (it answers {said or 'nothing'!r}): "
        "log in as this user, or start one at boot with `sudo loginctl enable-linger $USER`"
    )


def ask_job(manager: Manager, uid: int, run: Run) -> Job:
    if manager == "launchd":
        # Over ssh with no one logged in at the screen there is no GUI domain.
        gui = run(("launchctl", "print", f"gui/{uid}")).returncode == 0
        domain = f"gui/{uid}" if gui else f"user/{uid}"
        loaded = _launchd_loaded(run, domain)
        return Job(loaded, loaded, domain)
    enabled = run(_unit("is-enabled")).output.strip() == "enabled"
    active = run(_unit("is-active")).output.strip() == "active"
    return Job(enabled, active, "systemd --user")


def lingering(uid: int, run: Run, which: Which) -> bool | None:
    """Whether systemd-logind keeps this user's manager (and so the guardian's unit)
    running after the user's last session ends; None: cannot tell."""
    if which("loginctl") is None:
        return None
    said = run(("loginctl", "show-user", str(uid), "--property=Linger"))
    if said.returncode != 0:
        return None
    for line in said.output.splitlines():
        if line.strip() in ("Linger=yes", "Linger=no"):
            return line.strip() == "Linger=yes"
    return None


def run_commands(commands: Sequence[Command], run: Run, on_ran: Callable[[Command], None]) -> str:
    """Run each in turn; the first failure as one line ("" when all ran)."""
    for command in commands:
        done = run(command)
        if done.returncode != 0:
            said = done.output.splitlines()[0] if done.output else "no output"
            return f"`{' '.join(command)}` failed (exit status {done.returncode}): {said}"
        on_ran(command)
        if command[:2] == ("launchctl", "bootout"):
            _settle(run, command[2])
    return ""


def _settle(run: Run, target: str) -> None:
    # launchd tears a job down after `bootout` returns; a `bootstrap` meanwhile fails
    # with "Input/output error".
    domain = target.rpartition("/")[0]
    deadline = time.monotonic() + _SETTLE_SECONDS
    while _launchd_loaded(run, domain) and time.monotonic() < deadline:
        time.sleep(0.1)


def _launchd_loaded(run: Run, domain: str) -> bool:
    return run(("launchctl", "print", f"{domain}/{LABEL}")).returncode == 0


def started_as_service(command: Command, environment: Mapping[str, str]) -> Completed:
    """`command` run as launchd and systemd run the guardian: from /, with `environment`
    only (none of this shell's PYTHONPATH or virtualenv)."""
    return run_command(command, cwd="/", env=environment)


def run_command(
    command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> Completed:
    """The real runner: a command to its end, its output together (never raises)."""
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
            cwd=cwd,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        return Completed(127, f"{command[0]}: not found")
    except subprocess.TimeoutExpired:
        return Completed(124, f"no answer within {TIMEOUT_SECONDS:g} s")
    except OSError as error:
        return Completed(126, str(error))
    return Completed(done.returncode, "\n".join(filter(None, (done.stdout, done.stderr))).strip())
