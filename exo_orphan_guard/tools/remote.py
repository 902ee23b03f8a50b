"""`scan`, `sweep` and `doctor` on many hosts at once, over the user's own `ssh`.

Clusters driven by `mlx.launch` are a handful of machines reached by ssh: that is the
engine, with the user's config, keys and ProxyJump. Each host runs the same command
with its own installed `exo-orphan-guard`; nothing is installed by this module. Hosts
run in parallel; one report comes back, each host with its result or a one-line error.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast, final

SSH_COMMAND_ENV: Final = "EXO_ORPHAN_GUARD_SSH_COMMAND"
"""The ssh client and options to use (default `ssh`), as in GIT_SSH_COMMAND."""
REMOTE_CLI_ENV: Final = "EXO_ORPHAN_GUARD_REMOTE_CLI"
"""How the remote shell runs the CLI (default `exo-orphan-guard`), e.g. an absolute path."""
DEFAULT_REMOTE_CLI: Final = "exo-orphan-guard"
CONNECT_TIMEOUT_SECONDS: Final = 10
COMMAND_TIMEOUT_SECONDS: Final = 120.0
MAX_PARALLEL_HOSTS: Final = 32
HOSTS_SCHEMA: Final = "exo-orphan-guard/hosts-report/1"

EXIT_UNCHECKED: Final = 3
"""A host that could not be checked: unreachable, no CLI there, or a broken answer."""
_EXIT_SSH_FAILED: Final = 255
_EXIT_NOT_FOUND: Final = 127
_EXIT_NOT_EXECUTABLE: Final = 126

HostStatus = Literal["ok", "unreachable", "not-installed", "failed"]


@final
@dataclass(frozen=True, slots=True)
class HostResult:
    host: str
    status: HostStatus
    exit_code: int
    """The remote command's exit code when it ran; EXIT_UNCHECKED otherwise."""
    output: str
    """The remote command's stdout (its table, or its JSON document)."""
    error: str | None
    elapsed_seconds: float


@final
@dataclass(frozen=True, slots=True)
class HostsReport:
    command: str
    results: tuple[HostResult, ...]
    elapsed_seconds: float

    @property
    def exit_code(self) -> int:
        """The worst host's: 0 < 1 (orphans left) < 2 (usage/config) < 3 (unchecked)."""
        return max((result.exit_code for result in self.results), default=0)


def parse_host_list(text: str) -> list[str]:
    """`H1,H2,...` as given to `mlx.launch --hosts`; ValueError for an empty name."""
    hosts = [word.strip() for word in text.split(",")]
    if not all(hosts):
        raise ValueError(f"--hosts {text!r}: a host name is empty")
    return hosts


def parse_hostfile(path: Path) -> list[str]:
    """The `ssh` names of an `mlx.launch` hostfile: a JSON list of `{"ssh": ...}` objects,
    or an object whose `hosts` is that list. ValueError saying what is wrong."""
    try:
        document: object = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"--hostfile {path}: cannot read it ({error.strerror})") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--hostfile {path}: not JSON ({error})") from error
    if isinstance(document, dict):
        document = cast(dict[str, object], document).get("hosts")
    if not isinstance(document, list) or not document:
        raise ValueError(f"--hostfile {path}: expected a non-empty list of hosts")
    hosts: list[str] = []
    for index, entry in enumerate(cast(list[object], document)):
        name = cast(dict[str, object], entry).get("ssh") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f'--hostfile {path}: host {index} has no "ssh" name')
        hosts.append(name.strip())
    return hosts


def unique_hosts(hosts: Sequence[str]) -> list[str]:
    """Each host once, in order: a hostfile lists a host once per rank."""
    return list(dict.fromkeys(hosts))


def ssh_argv(host: str, words: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The local argv that runs `exo-orphan-guard WORDS...` on `host`.

    The remote CLI setting is inserted as the remote shell reads it (so `~/...` and
    `python3 -m exo_orphan_guard` work); every other word is quoted.
    """
    ssh = shlex.split(environ.get(SSH_COMMAND_ENV, "").strip() or "ssh")
    cli = environ.get(REMOTE_CLI_ENV, "").strip() or DEFAULT_REMOTE_CLI
    return [
        *ssh,
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}",
        "--",
        host,
        f"{cli} {shlex.join(words)}",
    ]


def classify(host: str, returncode: int, stdout: str, stderr: str, elapsed: float) -> HostResult:
    """What one host's ssh run means (pure)."""
    last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")

    def unchecked(status: HostStatus, error: str) -> HostResult:
        return HostResult(host, status, EXIT_UNCHECKED, stdout, error, elapsed)

    if returncode == _EXIT_SSH_FAILED:
        return unchecked("unreachable", last_line or "ssh failed (exit 255)")
    if returncode in (_EXIT_NOT_FOUND, _EXIT_NOT_EXECUTABLE):
        return unchecked(
            "not-installed",
            f"exo-orphan-guard cannot run there (exit {returncode}: {last_line or 'not found'}); "
            f"install it, or set {REMOTE_CLI_ENV} to its path on that host",
        )
    if returncode not in (0, 1, 2):
        return unchecked("failed", f"exit {returncode}: {last_line or 'no message'}")
    error = last_line if returncode == 2 else None
    return HostResult(host, "ok", returncode, stdout, error, elapsed)


def run_on_hosts(
    hosts: Sequence[str],
    command: str,
    words: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    timeout: float = COMMAND_TIMEOUT_SECONDS,
) -> HostsReport:
    """Run `exo-orphan-guard WORDS...` on every host in parallel."""
    env = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    chosen = unique_hosts(hosts)

    def one(host: str) -> HostResult:
        return _run_one(host, ssh_argv(host, words, env), timeout)

    with ThreadPoolExecutor(max_workers=max(1, min(len(chosen), MAX_PARALLEL_HOSTS))) as pool:
        results = tuple(pool.map(one, chosen))
    return HostsReport(command, results, time.monotonic() - started)


def _run_one(host: str, argv: list[str], timeout: float) -> HostResult:
    started = time.monotonic()
    try:
        completed = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return HostResult(
            host, "failed", EXIT_UNCHECKED, "", f"no ssh client: {argv[0]!r} not found", 0.0
        )
    except subprocess.TimeoutExpired:
        elapsed = time.monotonic() - started
        return HostResult(
            host, "failed", EXIT_UNCHECKED, "", f"no answer within {timeout:g} s", elapsed
        )
    elapsed = time.monotonic() - started
    return classify(host, completed.returncode, completed.stdout, completed.stderr, elapsed)


def check_sweep_arguments(match: str | None, any_parent: bool) -> None:
    """The checks the remote sweep would make, done once here; ValueError if wrong."""
    if any_parent and match is None:
        raise ValueError("--any-parent needs --match: it never applies to exo's own runners")
    if match is not None:
        try:
            re.compile(match)
        except re.error as error:
            raise ValueError(
                f"--match {match!r} is not a valid regular expression: {error}"
            ) from error


def to_json(report: HostsReport) -> str:
    hosts: list[dict[str, object]] = []
    for result in report.results:
        remote: object = None
        error = result.error
        if result.status == "ok" and result.output.strip():
            try:
                remote = json.loads(result.output)
            except json.JSONDecodeError:
                error = error or "the remote command did not print JSON"
        hosts.append(
            {
                "host": result.host,
                "status": result.status,
                "exit_code": result.exit_code,
                "error": error,
                "elapsed_s": round(result.elapsed_seconds, 4),
                "report": remote,
            }
        )
    document = {
        "schema": HOSTS_SCHEMA,
        "command": report.command,
        "exit_code": report.exit_code,
        "elapsed_s": round(report.elapsed_seconds, 4),
        "hosts": hosts,
    }
    return json.dumps(document, indent=2)


def to_text(report: HostsReport) -> str:
    lines: list[str] = []
    for result in report.results:
        state = "OK" if result.status == "ok" else result.status.upper()
        lines.append(
            f"== {result.host}: {state}, exit {result.exit_code} "
            f"({result.elapsed_seconds:.1f} s) =="
        )
        if result.output.strip():
            lines.append(result.output.rstrip("\n"))
        if result.error is not None:
            lines.append(f"error: {result.error}")
    checked = sum(result.status == "ok" for result in report.results)
    lines.append(f"{len(report.results)} host(s), {checked} checked, worst exit {report.exit_code}")
    return "\n".join(lines)
