"""launchctl and systemctl faked as far as `service` asks and acts, and a home with the
places a Mac and a Linux desktop have: what tests/test_service*.py share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exo_orphan_guard.tools import service
from exo_orphan_guard.tools.service_control import Command, Completed
from exo_orphan_guard.tools.service_files import LABEL, UNIT_NAME, Manager

UID = 501
USER = "ada"
CLI = ("/opt/exo/bin/exo-orphan-guard",)
ENVIRON = {
    "EXO_HOME": ".exo-test",
    "EXO_ORPHAN_GUARD_GRACE": "5",
    "EXO_ORPHAN_GUARD_WORKER": "77:1.5",
    "PATH": "/usr/bin:/bin",
}
PLIST = f"Library/LaunchAgents/{LABEL}.plist"
UNIT = f".config/systemd/user/{UNIT_NAME}"
QUERIES = ("print", "is-enabled", "is-active", "is-system-running", "show-user")


@dataclass
class FakeManager:
    """launchctl and systemctl as far as `service` asks and acts, answering as they do."""

    home: Path
    session: str = "running"
    gui: bool = True
    loaded: bool = False
    enabled: bool = False
    fail: str = ""
    """A subcommand that fails as launchd fails it."""
    linger: bool | None = True
    """What loginctl says of the user's lingering (None: it cannot tell)."""
    calls: list[Command] = field(default_factory=list[Command])

    @property
    def changes(self) -> list[Command]:
        return [call for call in self.calls if not set(QUERIES) & set(call)]

    def __call__(self, command: Command) -> Completed:
        self.calls.append(command)
        if command[1] == self.fail:
            return Completed(5, f"{self.fail} failed: 5: Input/output error")
        if command[0] == "launchctl":
            return self._launchctl(command[1:])
        if command[0] == "loginctl":
            return self._loginctl(command[1:])
        return self._systemctl(command[2:])

    def _loginctl(self, words: tuple[str, ...]) -> Completed:
        assert words == ("show-user", str(UID), "--property=Linger"), words
        if self.linger is None:
            return Completed(1, "Failed to connect to bus: No such file or directory")
        return Completed(0, f"Linger={'yes' if self.linger else 'no'}")

    def _launchctl(self, words: tuple[str, ...]) -> Completed:
        match words:
            case ("print", domain) if "/" not in domain.partition("/")[2]:
                return Completed(0 if self.gui else 113, "" if self.gui else "Could not find")
            case ("print", _):
                return Completed(0 if self.loaded else 113, "")
            case ("bootstrap", _, plist) if not self.loaded and Path(plist).is_file():
                self.loaded = True
            case ("bootout", _) if self.loaded:
                self.loaded = False
            case ("enable", _):
                pass
            case _:
                return Completed(5, f"{words[0]} failed: 5: Input/output error")
        return Completed(0, "")

    def _systemctl(self, words: tuple[str, ...]) -> Completed:
        link = self.home / ".config/systemd/user/default.target.wants" / UNIT_NAME
        match words:
            case ("is-system-running",):
                return Completed(0 if self.session == "running" else 1, self.session)
            case ("is-enabled", _):
                return Completed(0 if self.enabled else 1, "enabled" if self.enabled else "")
            case ("is-active", _):
                return Completed(0 if self.loaded else 3, "active" if self.loaded else "inactive")
            case ("enable", *now, _) if (self.home / UNIT).is_file():
                link.parent.mkdir(exist_ok=True)
                if not link.is_symlink():
                    link.symlink_to(self.home / UNIT)
                self.enabled, self.loaded = True, self.loaded or bool(now)
            case ("disable", "--now", _):
                link.unlink()
                self.enabled = self.loaded = False
            case ("daemon-reload",) | ("restart", _):
                pass
            case _:
                return Completed(1, f"Failed to {words[0]}: Unit file does not exist")
        return Completed(0, "")


def redirected_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with the places a Mac and a Linux desktop have, and exo's home in it."""
    home = tmp_path / "home"
    for directory in ("Library/LaunchAgents", ".config/systemd/user", ".exo-test"):
        (home / directory).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def context_for(
    manager: Manager,
    fake: FakeManager,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = lambda name: f"/usr/bin/{name}",
    *,
    uid: int = UID,
    home_owner: int | None = UID,
    cli: tuple[str, ...] = CLI,
    starts: Callable[[Command, Mapping[str, str]], Completed] | None = None,
) -> service.Context:
    return service.Context(
        manager=manager,
        platform="darwin" if manager == "launchd" else "linux",
        home=fake.home,
        uid=uid,
        home_owner=home_owner,
        name_of=lambda user: {UID: USER, 0: "root"}.get(user),
        environ=ENVIRON if environ is None else environ,
        cli=cli,
        run=fake,
        which=which,
        starts=starts or (lambda command, environment: Completed(0, "exo-orphan-guard 0.1.0")),
        source="/src/exo-orphan-guard",
    )


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))
