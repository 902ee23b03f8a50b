"""Real OpenSSH servers on 127.0.0.1 with throw-away keys, for the `--hosts` tests.

Each host alias gets its own `sshd` (its own port, its own config, never the system
one) whose sessions see the environment given for that alias: PATH decides whether
`exo-orphan-guard` is installed "there". The client side is an ssh config file used
through EXO_ORPHAN_GUARD_SSH_COMMAND (`ssh -F FILE`), so nothing of the user's own
ssh setup is read or changed. `stop()` kills every sshd and session it started.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exo_orphan_guard import system
from exo_orphan_guard.rig.scenarios import wait_gone
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

_START_TIMEOUT_SECONDS = 10.0
HOST_KEY_ALIAS = "eog-loopback"
PRIVILEGE_SEPARATION_DIR = Path("/run/sshd")


def find_sshd() -> str | None:
    return shutil.which("sshd") or next(
        (path for path in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(path, os.X_OK)),
        None,
    )


def why_sshd_cannot_run() -> str | None:
    """None if a loopback sshd can run here; otherwise the reason, for a skip."""
    if find_sshd() is None:
        return (
            "no sshd: install Debian's openssh-server "
            "(`apt-get install openssh-server`; `make setup` does it as root with apt-get)"
        )
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no ssh client or ssh-keygen (Debian: openssh-client)"
    if os.geteuid() == 0 and not PRIVILEGE_SEPARATION_DIR.is_dir():
        try:
            PRIVILEGE_SEPARATION_DIR.mkdir(mode=0o755, parents=True)
        except OSError as error:
            return f"sshd as root needs {PRIVILEGE_SEPARATION_DIR}: {error.strerror}"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LoopbackSshd:
    directory: Path
    config: Path
    """The client's ssh config: one `Host` per alias."""
    servers: dict[str, subprocess.Popen[bytes]] = field(
        default_factory=dict[str, subprocess.Popen[bytes]]
    )

    @property
    def ssh_command(self) -> str:
        """For EXO_ORPHAN_GUARD_SSH_COMMAND."""
        return f"ssh -F {self.config}"

    def ssh_argv(self, *words: str) -> list[str]:
        return ["ssh", "-F", str(self.config), *words]

    def stop(self) -> None:
        for server in self.servers.values():
            stop_tree(server)
        self.servers.clear()


def stop_tree(server: subprocess.Popen[bytes]) -> None:
    """SIGKILL an sshd and every session under it (stopped ones included)."""
    if server.poll() is None:
        os.kill(server.pid, signal.SIGSTOP)  # no new session while the tree is read
    members: list[ProcessIdentity] = []
    for pid in system.descendants(server.pid):
        identity = identity_of(pid)
        if identity is not None:
            members.append(identity)
    for identity in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, signal.SIGKILL)
    if server.poll() is None:
        server.kill()
    server.wait()
    wait_gone(members, 5.0)


def start_loopback_sshd(
    directory: Path, hosts: Mapping[str, Mapping[str, str]], *, unreachable: tuple[str, ...] = ()
) -> LoopbackSshd:
    """One sshd per alias in `hosts`, its sessions given that environment; aliases in
    `unreachable` point at a loopback port nobody listens on."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    sshd = find_sshd()
    assert sshd is not None
    host_key = directory / "host_ed25519"
    client_key = directory / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eog-test", "-f", str(key)],
            check=True,
        )
    authorized = directory / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    public_host_key = host_key.with_suffix(".pub").read_text().split()
    (directory / "known_hosts").write_text(
        f"{HOST_KEY_ALIAS} {public_host_key[0]} {public_host_key[1]}\n"
    )
    user = getpass.getuser()
    blocks: list[str] = []
    loopback = LoopbackSshd(directory, directory / "ssh_config")
    try:
        for alias, environment in hosts.items():
            port = free_port()
            server_config = directory / f"sshd_config-{alias}"
            settings = " ".join(f"{name}={value}" for name, value in environment.items())
            server_config.write_text(
                "\n".join(
                    [
                        f"Port {port}",
                        "ListenAddress 127.0.0.1",
                        f"HostKey {host_key}",
                        f"PidFile {directory / f'sshd-{alias}.pid'}",
                        f"AuthorizedKeysFile {authorized}",
                        "StrictModes no",
                        "UsePAM no",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PermitRootLogin prohibit-password",
                        f"AllowUsers {user}",
                        "PrintMotd no",
                        "PrintLastLog no",
                        "LogLevel ERROR",
                        *([f"SetEnv {settings}"] if settings else []),
                        "",
                    ]
                )
            )
            loopback.servers[alias] = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(server_config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            blocks.append(f"Host {alias}\n  Port {port}\n")
        blocks.extend(f"Host {alias}\n  Port {free_port()}\n" for alias in unreachable)
        blocks.append(
            "\n".join(
                [
                    "Host *",
                    "  HostName 127.0.0.1",
                    f"  User {user}",
                    f"  IdentityFile {client_key}",
                    "  IdentitiesOnly yes",
                    f"  HostKeyAlias {HOST_KEY_ALIAS}",
                    f"  UserKnownHostsFile {directory / 'known_hosts'}",
                    "  GlobalKnownHostsFile /dev/null",
                    "  StrictHostKeyChecking yes",
                    "  LogLevel ERROR",
                    "",
                ]
            )
        )
        loopback.config.write_text("\n".join(blocks))
        for alias in hosts:
            _wait_until_answering(loopback, alias)
    except BaseException:
        loopback.stop()
        raise
    return loopback


def _wait_until_answering(loopback: LoopbackSshd, alias: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_SECONDS
    while True:
        server = loopback.servers[alias]
        if server.poll() is not None:
            raise RuntimeError(f"sshd for {alias} exited with {server.returncode}")
        probe = subprocess.run(
            loopback.ssh_argv("-o", "BatchMode=yes", alias, "true"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT_SECONDS,
            check=False,
        )
        if probe.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"sshd for {alias} does not answer: {probe.stderr.strip()}")
        time.sleep(0.05)
