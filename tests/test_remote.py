"""The pure parts of `--hosts`: host lists, mlx.launch hostfiles, ssh argv, verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_orphan_guard.tools import remote
from exo_orphan_guard.tools.arguments import build_parser, forwarded_words


def test_host_list_keeps_order_and_rejects_empty_names() -> None:
    assert remote.parse_host_list("mac1, me@mac2,mac3") == ["mac1", "me@mac2", "mac3"]
    with pytest.raises(ValueError, match="empty"):
        remote.parse_host_list("mac1,,mac2")


def test_hostfile_in_both_mlx_launch_shapes(tmp_path: Path) -> None:
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2"}]))
    as_object = tmp_path / "object.json"
    as_object.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "mac1"}]}))
    assert remote.parse_hostfile(as_list) == ["mac1", "mac2"]
    assert remote.parse_hostfile(as_object) == ["mac1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "non-empty list"),
        ('{"hosts": 3}', "non-empty list"),
        ('[{"ips": []}]', 'host 0 has no "ssh" name'),
        ('[{"ssh": ""}]', 'host 0 has no "ssh" name'),
    ],
)
def test_a_bad_hostfile_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hosts.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        remote.parse_hostfile(path)
    with pytest.raises(ValueError, match="cannot read"):
        remote.parse_hostfile(tmp_path / "missing.json")


def test_a_host_listed_once_per_rank_is_visited_once() -> None:
    assert remote.unique_hosts(["a", "b", "a", "c", "b"]) == ["a", "b", "c"]


def test_ssh_argv_quotes_every_word_but_the_remote_cli_setting() -> None:
    environ = {
        remote.SSH_COMMAND_ENV: "ssh -F /tmp/my config",
        remote.REMOTE_CLI_ENV: "~/venv/bin/exo-orphan-guard",
    }
    argv = remote.ssh_argv("-oProxyCommand=x", ["sweep", "--match", "rank 1; rm -rf ~"], environ)
    assert argv[:4] == ["ssh", "-F", "/tmp/my", "config"]
    assert "BatchMode=yes" in argv and f"ConnectTimeout={remote.CONNECT_TIMEOUT_SECONDS}" in argv
    # The host comes after `--`: a host name is never read as an option.
    assert argv[-3:] == [
        "--",
        "-oProxyCommand=x",
        "~/venv/bin/exo-orphan-guard sweep --match 'rank 1; rm -rf ~'",
    ]
    assert remote.ssh_argv("h", ["scan"], {})[0] == "ssh"
    assert remote.ssh_argv("h", ["scan"], {})[-1] == "exo-orphan-guard scan"


@pytest.mark.parametrize(
    ("code", "stderr", "status", "exit_code"),
    [
        (0, "", "ok", 0),
        (1, "", "ok", 1),
        (2, "exo-orphan-guard: error: bad\n", "ok", 2),
        (255, "ssh: connect to host h port 22: Connection refused\n", "unreachable", 3),
        (127, "bash: line 1: exo-orphan-guard: command not found\n", "not-installed", 3),
        (126, "permission denied\n", "not-installed", 3),
        (139, "", "failed", 3),
    ],
)
def test_classify(code: int, stderr: str, status: str, exit_code: int) -> None:
    result = remote.classify("h", code, "{}", stderr, 0.5)
    assert (result.status, result.exit_code) == (status, exit_code)
    assert (result.error is None) == (code in (0, 1))
    if result.error is not None:
        assert "\n" not in result.error


def test_the_worst_host_decides_and_json_embeds_each_report() -> None:
    results = (
        remote.classify("a", 0, '{"schema": "x"}', "", 0.1),
        remote.classify("b", 1, '{"schema": "x"}', "", 0.1),
        remote.classify("c", 255, "", "ssh: Could not resolve hostname c\n", 0.1),
    )
    report = remote.HostsReport("scan", results, 0.2)
    assert report.exit_code == 3
    assert remote.HostsReport("scan", results[:2], 0.2).exit_code == 1
    document = json.loads(remote.to_json(report))
    assert document["schema"] == remote.HOSTS_SCHEMA and document["exit_code"] == 3
    assert [host["report"] for host in document["hosts"]] == [{"schema": "x"}] * 2 + [None]
    assert document["hosts"][2]["error"] == "ssh: Could not resolve hostname c"
    text = remote.to_text(report).splitlines()
    assert text[0].startswith("== a: OK, exit 0")
    assert "error: ssh: Could not resolve hostname c" in text
    assert text[-1] == "3 host(s), 2 checked, worst exit 3"


def test_no_ssh_client_is_a_host_error_not_a_crash() -> None:
    report = remote.run_on_hosts(
        ["h"], "scan", ["scan"], environ={remote.SSH_COMMAND_ENV: "/nonexistent/ssh"}
    )
    assert report.exit_code == 3
    assert report.results[0].error == "no ssh client: '/nonexistent/ssh' not found"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["sweep", "--hosts", "a", "--match", "rank", "--any-parent", "--all-users", "--now"],
            ["sweep", "--match", "rank", "--any-parent", "--all-users", "--now"],
        ),
        (
            ["scan", "--hostfile", "h.json", "--json", "--all", "--dir", "/r"],
            ["scan", "--json", "--dir", "/r", "--all"],
        ),
        (
            ["sweep", "--hosts", "a", "--dry-run", "--grace", "3"],
            ["sweep", "--dry-run", "--grace", "3.0"],
        ),
        (["doctor", "--hosts", "a", "--exo", "/x"], ["doctor", "--exo", "/x"]),
    ],
)
def test_each_host_gets_every_argument_but_the_host_list(argv: list[str], words: list[str]) -> None:
    assert forwarded_words(build_parser().parse_args(argv), argv[0]) == words
