from __future__ import annotations

from pathlib import Path

import pytest

from exo_orphan_guard.system import settings
from exo_orphan_guard.tools.arguments import build_parser


@pytest.mark.parametrize("raw", ["1", "true", "True", "TRUE"])
def test_toggle_on_words_are_the_ones_exo_reads(raw: str) -> None:
    """exo's hooks module: `os.getenv("EXO_ORPHAN_GUARD", "false").lower() in ("true",
    "1")`. Whatever it takes for on, so does the package, and nothing else."""
    assert settings.parse_toggle(raw) == settings.Parsed(True)
    assert (raw.lower() in ("true", "1")) is True


@pytest.mark.parametrize("raw", [None, "", "0", "false", "False"])
def test_toggle_off_words_and_unset(raw: str | None) -> None:
    assert settings.parse_toggle(raw) == settings.Parsed(False)


@pytest.mark.parametrize("raw", ["2", "enable", "tru", "1 1", "on!", "yes", "on", " true", "no"])
def test_odd_toggle_values_stay_off_with_a_warning_naming_the_value(raw: str) -> None:
    parsed = settings.parse_toggle(raw)
    assert parsed.value is False
    assert parsed.warning is not None and repr(raw) in parsed.warning
    assert "\n" not in parsed.warning


@pytest.mark.parametrize("strategy", settings.STRATEGIES)
def test_every_strategy_name_parses(strategy: settings.Strategy) -> None:
    assert settings.parse_strategy(strategy.upper()) == settings.Parsed(strategy)


def test_unknown_strategy_falls_back_to_auto_with_a_warning() -> None:
    parsed = settings.parse_strategy("kqeue")
    assert parsed.value == "auto"
    assert parsed.warning is not None and "'kqeue'" in parsed.warning


@pytest.mark.parametrize(
    ("raw", "seconds"), [(None, 10.0), ("", 10.0), ("0", 0.0), ("0.5", 0.5), ("120", 120.0)]
)
def test_grace(raw: str | None, seconds: float) -> None:
    assert settings.parse_grace(raw) == settings.Parsed(seconds)


@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "inf", "121"])
def test_bad_grace_uses_the_default_with_a_warning(raw: str) -> None:
    parsed = settings.parse_grace(raw)
    assert parsed.value == settings.DEFAULT_GRACE_SECONDS and parsed.warning is not None


def test_registry_dir_override_and_default() -> None:
    assert str(settings.registry_dir({settings.DIR_ENV: "/x/y"})) == "/x/y"
    assert settings.registry_dir({}, "darwin").parts[-2:] == (".exo", "orphan-guard")
    assert settings.registry_dir({}, "linux").parts[-3:] == (".cache", "exo", "orphan-guard")


def test_the_registry_is_in_exos_cache_directory_as_exos_constants_find_it() -> None:
    """exo's constants.py: `~/$EXO_HOME`, else `~/.exo` on macOS, else the XDG cache."""
    home = settings.former_registry_dir().parent.parent
    xdg = {settings.XDG_CACHE_ENV: "/c"}
    assert settings.registry_dir(xdg, "linux") == Path("/c/exo/orphan-guard")
    assert settings.registry_dir(xdg, "darwin") == home / ".exo" / "orphan-guard"
    both = {**xdg, settings.EXO_HOME_ENV: ".exo-b"}
    assert settings.registry_dir(both, "linux") == home / ".exo-b" / "orphan-guard"
    assert settings.registry_dirs(xdg, "linux") == (
        Path("/c/exo/orphan-guard"),
        home / ".exo" / "orphan-guard",
    )
    assert settings.registry_dirs({}, "darwin") == (home / ".exo" / "orphan-guard",)


@pytest.mark.parametrize(
    ("raw", "seconds"), [(None, 120.0), (" ", 120.0), ("0", 0.0), ("2.5", 2.5), ("900", 900.0)]
)
def test_busy_wait(raw: str | None, seconds: float) -> None:
    assert settings.parse_busy_wait(raw) == settings.Parsed(seconds)


@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "inf", "901"])
def test_bad_busy_wait_uses_the_default_with_a_warning_naming_the_value(raw: str) -> None:
    parsed = settings.parse_busy_wait(raw)
    assert parsed.value == settings.DEFAULT_BUSY_WAIT_SECONDS
    assert parsed.warning is not None and repr(raw) in parsed.warning


def test_busy_wait_zero_is_the_old_wedge_bound() -> None:
    assert settings.busy_bound(0.0) == settings.WEDGE_SECONDS
    assert settings.busy_bound(3.0) == 3.0


@pytest.mark.parametrize("raw", ["1e-9", "0.0001", "0.49"])
def test_a_busy_wait_below_the_wedge_bound_is_raised_to_it_with_a_warning(raw: str) -> None:
    parsed = settings.parse_busy_wait(raw)
    assert parsed.value == settings.WEDGE_SECONDS
    assert parsed.warning is not None and repr(raw) in parsed.warning
    assert settings.parse_busy_wait("0.5") == settings.Parsed(0.5)  # the bound itself: as is


@pytest.mark.parametrize("raw", ["1e-9", "0.0001", "0.49"])
def test_a_grace_below_the_floor_is_raised_to_it_with_a_warning(raw: str) -> None:
    parsed = settings.parse_grace(raw)
    assert parsed.value == settings.MIN_GRACE_SECONDS
    assert parsed.warning is not None and repr(raw) in parsed.warning
    assert settings.parse_grace("0.5") == settings.Parsed(0.5)  # the floor itself: as is
    assert settings.parse_grace("0") == settings.Parsed(0.0)  # still: killed at once


def test_an_explicit_grace_on_the_command_line_has_no_floor() -> None:
    """`sweep --grace 0.2`: one command's own choice, which reaches no runner."""
    parsed = build_parser().parse_args(["sweep", "--grace", "0.2"])
    assert parsed.grace == 0.2
    assert build_parser().parse_args(["exec", "--grace", "1e-9", "--", "true"]).grace == 1e-9


def test_the_registry_follows_exo_home_and_keeps_reading_the_former_one() -> None:
    home = settings.former_registry_dir().parent.parent
    moved = {settings.EXO_HOME_ENV: ".exo-b"}
    assert settings.registry_dir(moved) == home / ".exo-b" / "orphan-guard"
    assert settings.registry_dirs(moved) == (
        home / ".exo-b" / "orphan-guard",
        home / ".exo" / "orphan-guard",
    )
    assert settings.registry_dirs({settings.EXO_HOME_ENV: ".exo"}) == (
        home / ".exo" / "orphan-guard",
    )
    # An explicit directory is the only one: an operator's choice is not second-guessed.
    assert settings.registry_dirs({**moved, settings.DIR_ENV: "/x"}) == (Path("/x"),)
