"""The README's quick start as tests/test_quick_start.py runs it: its code blocks, read
from the README, and a new account (a home, a terminal's PATH, uv) to type them in."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import fake_systemd
from .dist import ROOT, UV

UV_INSTALLER = "curl -LsSf https://astral.sh/uv/install.sh | sh"
CHECKOUT = "~/src/exo-orphan-guard"
README_HOSTS = "10.0.0.1,10.0.0.2"
COMMAND_SECONDS = 600.0
USER = "ada"


@dataclass(frozen=True)
class QuickStart:
    """The lines of each of its blocks, as written (comments included)."""

    get_uv: list[str]
    app: list[str]
    source: list[str]
    mlx: list[str]


def the_quick_start() -> QuickStart:
    section = (ROOT / "README.md").read_text().split("\n## Quick start\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)
    lines = [[line for line in block.splitlines() if line.strip()] for block in blocks]
    assert len(lines) == 4, "the quick start changed: teach tests/test_quick_start.py its blocks"
    return QuickStart(*lines)


def words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def shell(line: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`line` as a user types it into a terminal (bash), to its end."""
    return subprocess.run(
        ["bash", "-e", "-c", line],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=False,
    )


@dataclass(frozen=True)
class Account:
    home: Path
    env: dict[str, str]
    """What a new terminal of this account has, plus uv's offline settings."""

    def run(self, line: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`line` typed in the home directory (or `cwd`), which must succeed."""
        done = shell(line, cwd or self.home, self.env)
        assert done.returncode == 0, f"{line}\nexit {done.returncode}:\n{done.stdout}{done.stderr}"
        return done

    @property
    def cli(self) -> Path:
        """Where the quick start says `uv tool install` puts the CLI."""
        return self.home / ".local" / "bin" / "exo-orphan-guard"


@contextlib.contextmanager
def new_account(uv_index: Path) -> Generator[Account]:
    """A home with a checkout of this repository at CHECKOUT (this work tree's files,
    tracked and new, as a fresh clone of them) and uv where its installer puts it
    (`~/.local/bin`, on a new terminal's PATH); `systemctl` and `loginctl` faked.

    Outside /tmp: `service install` rightly refuses a CLI in a temporary directory.
    uv works offline from `uv_index` (a directory of distributions), with this
    interpreter."""
    if not UV.exists():
        raise AssertionError(f"uv is a test dependency but {UV} is missing: make setup")
    base = Path(tempfile.mkdtemp(prefix="eog-quick-start-", dir="/var/tmp"))
    try:
        home = base / "home"
        _copy_this_checkout(home / "src" / "exo-orphan-guard")
        local_bin = home / ".local" / "bin"
        local_bin.mkdir(parents=True)
        (local_bin / "uv").symlink_to(UV)
        fakes = base / "fakes"
        fake_systemd.install_fakes(fakes, base / "systemd-state.json")
        # A Mac gives every account a TMPDIR of its own; without one, uv leaves its
        # lock files in /tmp.
        (base / "tmp").mkdir()
        env = {
            "HOME": str(home),
            "TMPDIR": str(base / "tmp"),
            "USER": USER,
            "LANG": "C.UTF-8",
            "PATH": f"{local_bin}:{fakes}:/usr/bin:/bin",
            "UV_OFFLINE": "1",
            "UV_NO_INDEX": "1",
            "UV_FIND_LINKS": str(uv_index),
            "UV_NO_CONFIG": "1",
            "UV_PYTHON": os.path.realpath(sys.executable),
            "UV_PYTHON_DOWNLOADS": "never",
        }
        yield Account(home, env)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _copy_this_checkout(target: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in sorted(set(filter(None, listed.stdout.decode().split("\0")))):
        source = ROOT / name
        if source.is_file():  # deleted from the work tree: not in a clone of it
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
