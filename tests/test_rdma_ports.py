"""doctor's RDMA line, on `ibv_devinfo` output in rdma-core's exact format.

The fixtures follow `libibverbs/examples/devinfo.c`'s printf calls byte for byte
(tabs included): `hca_id:\\t%s`, `\\t\\tport:\\t%d`, `\\t\\t\\tstate:\\t\\t\\t%s (%d)`; the
verbose one adds what `-v` prints, the older one rdma-core's former "Device ports:"
line. The real tool (Debian's ibverbs-utils, the same rdma-core) runs at the end.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

import pytest

from exo_orphan_guard.exo import explain
from exo_orphan_guard.tools import rdma_ports
from exo_orphan_guard.tools.rdma_ports import Port


def device(name: str, *states: str) -> str:
    header = (
        f"hca_id:\t{name}\n"
        "\ttransport:\t\t\tInfiniBand (0)\n"
        "\tnode_guid:\t\t\t2e4c:1aff:fe10:7b42\n"
        "\tsys_image_guid:\t\t\t2e4c:1aff:fe10:7b42\n"
        "\tvendor_id:\t\t\t0x05ac\n"
        "\tvendor_part_id:\t\t\t0\n"
        "\thw_ver:\t\t\t\t0x0\n"
        f"\tphys_port_cnt:\t\t\t{len(states)}\n"
    )
    ports = "".join(
        f"\t\tport:\t{number}\n"
        f"\t\t\tstate:\t\t\t{state}\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n"
        "\t\t\tactive_mtu:\t\t1024 (3)\n"
        "\t\t\tsm_lid:\t\t\t0\n"
        "\t\t\tport_lid:\t\t0\n"
        "\t\t\tport_lmc:\t\t0x00\n"
        "\t\t\tlink_layer:\t\tEthernet\n"
        "\n"
        for number, state in enumerate(states, 1)
    )
    return header + ports


ACTIVE = device("rdma_en2", "PORT_ACTIVE (4)") + device("rdma_en3", "PORT_ACTIVE (4)")
DOWN = device("rdma_en2", "PORT_ACTIVE (4)") + device("rdma_en3", "PORT_DOWN (1)")
VERBOSE = (
    device("rdma_en2", "PORT_ACTIVE (4)")
    .replace(
        "\t\t\tlink_layer:\t\tEthernet\n",
        "\t\t\tlink_layer:\t\tEthernet\n"
        "\t\t\tmax_msg_sz:\t\t0x40000000\n"
        "\t\t\tport_cap_flags:\t\t0x04010000\n"
        "\t\t\tactive_width:\t\t1X (1)\n"
        "\t\t\tphys_state:\t\tDISABLED (3)\n"
        "\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:2c4c:1aff:fe10:7b42\n",
    )
    .replace(
        "\tphys_port_cnt:\t\t\t1\n",
        "\tphys_port_cnt:\t\t\t1\n\tmax_qp:\t\t\t\t16\n\t\t\t\t\tRESIZE_MAX_WR\n",
    )
)
OLDER = device("mlx5_0", "PORT_INIT (2)").replace(
    "\tphys_port_cnt:\t\t\t1\n", "\tphys_port_cnt:\t\t\t1\n\tDevice ports:\n"
)


def runs(stdout: str, stderr: str = "", code: int = 0) -> rdma_ports.Runner:
    def run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(command), code, stdout, stderr)

    return run


def report_of(stdout: str, stderr: str = "", code: int = 0) -> rdma_ports.RdmaReport:
    return rdma_ports.read_devinfo(lambda _: "/usr/bin/ibv_devinfo", runs(stdout, stderr, code))


def test_every_port_active_is_ok() -> None:
    report = report_of(ACTIVE)
    assert report.devices == ("rdma_en2", "rdma_en3")
    assert report.ports == (Port("rdma_en2", 1, "PORT_ACTIVE"), Port("rdma_en3", 1, "PORT_ACTIVE"))
    check = rdma_ports.check(report)
    assert check.status == "OK"
    assert check.detail == "rdma_en2 port 1 PORT_ACTIVE, rdma_en3 port 1 PORT_ACTIVE"


def test_a_port_down_is_a_warning_with_the_maintainers_remedy() -> None:
    check = rdma_ports.check(report_of(DOWN))
    assert check.status == "WARN" and "rdma_en3 port 1 is PORT_DOWN" in check.detail
    assert "errno 96" in check.detail
    step = str(check.next_step)
    assert "reconnect" in step and "restart both Macs" in step and "exo/issues/1973" in step
    assert check.figures["ports"] == [
        {"device": "rdma_en2", "port": 1, "state": "PORT_ACTIVE"},
        {"device": "rdma_en3", "port": 1, "state": "PORT_DOWN"},
    ]


def test_verbose_and_older_output_parse_the_same_way() -> None:
    assert rdma_ports.parse(VERBOSE) == (("rdma_en2",), (Port("rdma_en2", 1, "PORT_ACTIVE"),))
    assert rdma_ports.parse(OLDER) == (("mlx5_0",), (Port("mlx5_0", 1, "PORT_INIT"),))
    assert rdma_ports.check(report_of(OLDER)).status == "WARN"


def test_several_ports_of_one_device() -> None:
    text = device("rdma_en4", "PORT_ACTIVE (4)", "PORT_ARMED (3)")
    assert rdma_ports.parse(text)[1] == (
        Port("rdma_en4", 1, "PORT_ACTIVE"),
        Port("rdma_en4", 2, "PORT_ARMED"),
    )


def test_no_device_says_so() -> None:
    check = rdma_ports.check(report_of("", "No IB devices found\n", 255))
    assert check.status == "SKIP" and "No IB devices found" in check.detail


def test_no_tool_says_so() -> None:
    check = rdma_ports.check(rdma_ports.read_devinfo(lambda _: None))
    assert check.status == "SKIP" and "ibv_devinfo is not on PATH" in check.detail


def test_a_tool_that_cannot_run_says_so() -> None:
    def fails(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(list(command), rdma_ports.TIMEOUT_SECONDS)

    report = rdma_ports.read_devinfo(lambda _: "/usr/bin/ibv_devinfo", fails)
    check = rdma_ports.check(report)
    assert check.status == "SKIP" and "could not run ibv_devinfo" in check.detail


def test_explain_errno_96_points_to_this_check() -> None:
    (explanation,) = explain.explain("Changing queue pair to RTR failed with errno 96")
    assert any("doctor" in step and "rdma ports" in step for step in explanation.next_steps)


@pytest.mark.skipif(
    shutil.which("ibv_devinfo") is None,
    reason="needs ibv_devinfo (Debian's ibverbs-utils: scripts/ensure-test-packages)",
)
def test_the_real_tool_is_read() -> None:
    report = rdma_ports.read_devinfo()
    check = rdma_ports.check(report)
    if report.devices:  # a machine with RDMA devices: every port has a state
        assert report.ports and check.status in ("OK", "WARN")
    else:  # this project's machines: rdma-core says why there is none
        assert report.message and check.status == "SKIP" and report.message in check.detail
