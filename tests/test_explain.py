from __future__ import annotations

import json

import pytest

from exo_orphan_guard.exo.explain import RULES, explain, render
from exo_orphan_guard.tools import cli

FIELD_LINES = {
    "ValueError: [jaccl] Changing queue pair to RTR failed with errno 16": "rtr-errno-16",
    "[jaccl] Creating the queue pair failed with errno 16. Thunderbolt RDMA": "rtr-errno-16",
    "errno 16": "rtr-errno-16",
    "16": "rtr-errno-16",
    "ValueError: [jaccl] Changing queue pair to RTR failed with errno 96": "rtr-errno-96",
    "96": "rtr-errno-96",
    "RuntimeError: [jaccl] Recv failed with errno=60": "errno-60",
    "RuntimeError: [jaccl] Couldn't connect (error: 60)": "errno-60",
    "[jaccl] Changing queue pair to RTR failed with errno 22": "rtr-errno-22",
    "RuntimeError: [jaccl] Couldn't allocate protection domain": "protection-domain",
    "RuntimeError: [jaccl] Recv failed with errno=2": "recv-errno-2",
    'HTTP 503: {"detail": "Model likely does not fit"}': "does-not-fit",
}


@pytest.mark.parametrize(("line", "key"), FIELD_LINES.items())
def test_field_lines_get_their_explanation(line: str, key: str) -> None:
    assert [explanation.key for explanation in explain(line)] == [key]


@pytest.mark.parametrize("line", ["hello", "errno 166", "port 50300", "exitcode=1", "errno 2"])
def test_unrelated_text_is_not_explained(line: str) -> None:
    assert explain(line) == []
    assert render(line, []).startswith("No diagnosis for")


def test_every_explanation_names_next_steps_and_public_sources() -> None:
    for rule in RULES:
        explanation = rule.explanation
        assert explanation.next_steps and explanation.sources
        assert all(source.startswith("https://") for source in explanation.sources)
        commands = " ".join(explanation.next_steps)
        assert any(word in commands for word in ("scan", "sweep", "doctor"))


def test_cli_explain_exit_codes_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "RTR", "failed", "with", "errno", "16"]) == 0
    assert "exo-orphan-guard sweep" in capsys.readouterr().out
    assert cli.main(["explain", "--json", "Recv failed with errno=2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["explanations"][0]["key"] == "recv-errno-2"
    assert cli.main(["explain", "no such thing"]) == 1
