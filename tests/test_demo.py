"""`make demo` end to end, and Ctrl-C at its worst moments: nothing it started survives.

Every process the demo starts inherits a tag in its environment, so the test finds them
all, orphans and multiprocessing's helpers included, wherever they were reparented.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard.demo.__main__ import DEMO_BUSY_WAIT_SECONDS
from exo_orphan_guard.rig.ring_scenario import mlx_available

# The demo's start-up sweep is a real, machine-wide one.
pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="finds the demo's processes through /proc"
    ),
    pytest.mark.machine_wide,
]

TAG_VARIABLE = "EOG_DEMO_TEST_TAG"
DEMO_TIMEOUT_SECONDS = 120.0
LEFTOVER_TIMEOUT_SECONDS = 5.0


def tagged(tag: str) -> set[int]:
    """Live processes whose environment carries the tag (zombies hold nothing)."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def wait_all_gone(tag: str) -> set[int]:
    deadline = time.monotonic() + LEFTOVER_TIMEOUT_SECONDS
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def demo_tag() -> Iterator[str]:
    tag = uuid.uuid4().hex
    yield tag
    for pid in tagged(tag):  # whatever a failed test leaves, the suite does not
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_demo(tag: str, *sections: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env[TAG_VARIABLE] = tag
    return subprocess.Popen(
        [sys.executable, "-m", "exo_orphan_guard.demo", *sections],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def read_until(demo: subprocess.Popen[str], needle: str, timeout: float) -> str:
    assert demo.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        ready, _, _ = select.select([demo.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = demo.stdout.readline() if ready else ""
        assert line, f"the demo never printed {needle!r}; it printed:\n{seen}"
        seen += line
    return seen


@pytest.mark.skipif(not mlx_available(), reason="needs mlx[cpu] (a test dependency on Linux)")
def test_the_demo_shows_watch_sweep_and_tools_and_leaves_nothing(demo_tag: str) -> None:
    demo = start_demo(demo_tag)
    try:
        output, _ = demo.communicate(timeout=DEMO_TIMEOUT_SECONDS)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, output
    sections = dict(
        (match.group(1), body)
        for match, body in zip(
            re.finditer(r"^== (\d)\. .*==$", output, re.MULTILINE),
            re.split(r"^== \d\. .*==$", output, flags=re.MULTILINE)[1:],
            strict=True,
        )
    )
    assert sorted(sections) == ["1", "2", "3", "4", "5", "6"]
    assert not any("FAIL" in sections[number] for number in "12345"), output
    assert "2 orphaned runner(s) still running" in sections["1"]
    assert "No orphans left." in sections["2"]
    assert re.search(r"\(idle\): gone \d+ ms after the kill: ended cleanly", sections["2"])
    assert re.search(
        r"\(holding the GIL in native code, never returning\): gone \d+ ms after the kill: "
        r"killed as wedged",
        sections["2"],
    )
    assert re.search(
        r"\(inside one long mx.eval\): gone \d+ ms after the kill, \d+ ms after its call "
        r"returned: ended cleanly, by itself",
        sections["2"],
    ), sections["2"]
    assert f"(busy in native code for {DEMO_BUSY_WAIT_SECONDS:.1f} s (GIL held))" in sections["2"]
    assert "guard on:  the rank was gone" in sections["3"]
    sweep = sections["4"]
    if "another sweep running on this machine took" in sweep:
        pytest.skip("another sweep on this machine took the demo's orphans first")
    orphans = re.search(
        r"The demo's orphans: (\d+) \(idle runner\), (\d+) \(rank 0 in init\)", sweep
    )
    assert orphans is not None, sweep
    scan = sweep.split("$ exo-orphan-guard scan", 1)[1].split("(exit code", 1)[0]
    for pid in orphans.groups():
        # The real CLI lists each with its ppid, age, memory and rule...
        assert re.search(
            rf"^\s+{pid}\s+\d+\s+\d+s\s+[\d.]+ MiB rss\s+\S+\s+fingerprint", scan, re.M
        )
        # ...and the new worker's start-up sweep kills it and logs it.
        assert f"ended orphan {pid} clean (SIGINT;" in sweep
    assert "errno 16 (EBUSY)" in sweep and "exo-orphan-guard sweep" in sweep
    assert "Both leftovers are gone." in sweep
    assert "The next group formed on the same ports: all_sum = rank 0: 3, rank 1: 3" in sweep
    assert re.search(r"New worker started -> group formed: [\d.]+ s", sweep)
    launch = sections["5"]
    assert re.search(r"without the wrapper: .*\n  kill -9 launcher; 1 s later 2 left", launch)
    assert re.search(r"with the wrapper: .*\n  kill -9 launcher; all gone [\d.]+ ms after", launch)
    # The doctor looks at the whole machine: other orphans may exist, never the demo's.
    doctor = sections["6"]
    orphans_line = re.search(r"^\s+(OK|FAIL)\s+orphans .*$", doctor, re.M)
    assert orphans_line is not None, doctor
    assert not any(re.search(rf"\b{pid}\b", orphans_line[0]) for pid in orphans.groups())
    # The start-up sweep unwound the demo's orphans through Python (SIGINT): none is
    # among the doctor's hard kills.
    hard_kills = re.search(r"^\s+WARN\s+hard kills .*$", doctor, re.M)
    for pid in orphans.groups():
        assert hard_kills is None or f"pid {pid} at " not in hard_kills[0], doctor
    assert not wait_all_gone(demo_tag)


@pytest.mark.parametrize(
    ("section", "moment"),
    [
        # Two unguarded orphans alive, the demo asleep.
        ("1", "kill -9"),
        # Orphans from the stand-in exo install, the CLI running.
        ("4", "$ exo-orphan-guard scan"),
    ],
)
def test_ctrl_c_at_any_moment_leaves_nothing_behind(
    demo_tag: str, section: str, moment: str
) -> None:
    if section == "4" and not mlx_available():
        pytest.skip("needs mlx[cpu] (a test dependency on Linux)")
    demo = start_demo(demo_tag, section)
    try:
        read_until(demo, moment, DEMO_TIMEOUT_SECONDS)
        # Something of the demo's runs besides itself (orphans, a worker, the CLI), or the
        # test would prove nothing; how much depends on other sweeps on this machine.
        assert tagged(demo_tag) - {demo.pid}, "nothing to clean up: the test would prove nothing"
        demo.send_signal(signal.SIGINT)  # the demo alone, as a terminal would not spare it
        demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130
    assert not wait_all_gone(demo_tag)


def test_a_section_that_does_not_exist_is_one_error_and_exit_code_2(demo_tag: str) -> None:
    demo = start_demo(demo_tag, "7")
    output, _ = demo.communicate(timeout=DEMO_TIMEOUT_SECONDS)
    assert demo.returncode == 2
    assert "no section 7: the demo has sections 1-6" in output.splitlines()[-1], output
    assert "==" not in output  # nothing was shown, nothing started
