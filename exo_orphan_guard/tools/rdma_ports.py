"""`doctor`'s RDMA line: each device's ports, as `ibv_devinfo` shows them.

exo #1973: after an idle night every RDMA instance failed with "Changing queue pair to
RTR failed with errno 96", and restarting exo did not help: the port had stopped
working. macOS 26.2 and later ship rdma-core's `ibv_devinfo` (Apple TN3205), which
prints each port's state; anything but PORT_ACTIVE cannot carry a queue pair.

The format is rdma-core's `libibverbs/examples/devinfo.c`: `hca_id:\t<device>` at the
start of a line, then per port `\t\tport:\t<n>` and `\t\t\tstate:\t\t\tPORT_ACTIVE (4)`;
with no device, "No IB devices found" (or "Failed to get IB devices list: ...") on
stderr and exit status 255.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, final

from .check import Check

NAME: Final = "rdma ports"
TOOL: Final = "ibv_devinfo"
ACTIVE: Final = "PORT_ACTIVE"
TIMEOUT_SECONDS: Final = 10.0
EXO_1973: Final = "https://github.com/exo-explore/exo/issues/1973"
REMEDY: Final = (
    "reconnect that port's Thunderbolt cable; if it does not come back to PORT_ACTIVE, "
    f"restart both Macs (exo's maintainers, {EXO_1973}); a port with no cable stays down"
)


@final
@dataclass(frozen=True, slots=True)
class Port:
    device: str
    port: int
    state: str
    """PORT_ACTIVE, PORT_DOWN, PORT_INIT, PORT_ARMED, or what ibv_devinfo printed."""


@final
@dataclass(frozen=True, slots=True)
class RdmaReport:
    tool: str | None
    """Where ibv_devinfo is; None: not on PATH."""
    devices: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()
    message: str | None = None
    """What ibv_devinfo said when it listed no device, or why it could not run."""


NOT_ON_PATH: Final = RdmaReport(None)

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def parse(text: str) -> tuple[tuple[str, ...], tuple[Port, ...]]:
    """Devices and their ports' states from `ibv_devinfo` output (verbose or not)."""
    devices: list[str] = []
    ports: list[Port] = []
    port: int | None = None
    for line in text.splitlines():
        key, separator, value = line.strip().partition(":")
        value = value.strip()
        if not separator:
            continue
        if key == "hca_id" and not line[:1].isspace():
            devices.append(value)
            port = None
        elif key == "port" and devices and value.isdigit():
            port = int(value)
        elif key == "state" and devices and port is not None and value:
            ports.append(Port(devices[-1], port, value.split()[0]))
            port = None
    return tuple(devices), tuple(ports)


def read_devinfo(
    which: Callable[[str], str | None] = shutil.which, run: Runner | None = None
) -> RdmaReport:
    tool = which(TOOL)
    if tool is None:
        return NOT_ON_PATH
    try:
        completed = (run or _run)([tool])
    except (OSError, subprocess.SubprocessError) as error:
        return RdmaReport(tool, message=f"could not run {TOOL}: {error}")
    devices, ports = parse(completed.stdout)
    if devices:
        return RdmaReport(tool, devices, ports)
    said = (completed.stderr or completed.stdout).strip().splitlines()
    return RdmaReport(tool, message=said[0] if said else f"exit status {completed.returncode}")


def check(report: RdmaReport) -> Check:
    figures = to_json(report)
    if report.tool is None:
        return Check(NAME, "SKIP", f"{TOOL} is not on PATH (macOS 26.2+ ships it)", figures=figures)
    if not report.devices:
        return Check(
            NAME, "SKIP", f"no RDMA device: {TOOL} says {report.message!r}", figures=figures
        )
    states = ", ".join(f"{port.device} port {port.port} {port.state}" for port in report.ports)
    silent = [device for device in report.devices if all(p.device != device for p in report.ports)]
    down = [port for port in report.ports if port.state != ACTIVE]
    if not down and not silent:
        return Check(NAME, "OK", states, figures=figures)
    problems = [f"{port.device} port {port.port} is {port.state}" for port in down]
    problems += [f"{device} shows no port state" for device in silent]
    return Check(
        NAME,
        "WARN",
        f"{'; '.join(problems)} (all: {states or 'none'}); a port not {ACTIVE} cannot set "
        "up a queue pair (RTR errno 96)",
        REMEDY,
        figures=figures,
    )


def to_json(report: RdmaReport) -> dict[str, object]:
    return {
        "tool": report.tool,
        "devices": list(report.devices),
        "ports": [{"device": p.device, "port": p.port, "state": p.state} for p in report.ports],
        "message": report.message,
    }


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
    )
