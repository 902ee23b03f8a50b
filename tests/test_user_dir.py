"""Where the guardian keeps what is one per user and machine (`records.user_dir`): in
the home the password database names, moved by none of the variables that move the
registry, and checked as the registry is."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from exo_orphan_guard.records.host_key import host_key
from exo_orphan_guard.records.user_dir import user_dir
from exo_orphan_guard.system import settings

_HOME = Path(pwd.getpwuid(os.geteuid()).pw_dir)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"HOME": "/elsewhere"},
        {settings.EXO_HOME_ENV: "exo-b", settings.XDG_CACHE_ENV: "/cache-b"},
        {settings.DIR_ENV: "/registry-b"},
        {settings.DIR_ENV: "relative/registry"},
    ],
)
def test_no_variable_that_moves_the_registry_moves_it(environ: dict[str, str]) -> None:
    found = settings.user_dir_setting(environ)
    assert found == settings.Parsed(_HOME / ".exo-orphan-guard")


def test_its_own_setting_moves_it_only_to_an_absolute_path() -> None:
    moved = settings.user_dir_setting({settings.USER_DIR_ENV: "/srv/guard"})
    assert moved == settings.Parsed(Path("/srv/guard"))
    relative = settings.user_dir_setting({settings.USER_DIR_ENV: "guard"})
    assert relative.value == _HOME / ".exo-orphan-guard"
    assert relative.warning is not None and "not an absolute path" in relative.warning


def test_it_is_made_private_per_host_and_refused_when_others_may_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "guard"
    monkeypatch.setenv(settings.USER_DIR_ENV, str(root))
    assert user_dir(create=False) == (None, None)
    made, problem = user_dir(create=True)
    assert problem is None and made is not None and made == root / host_key().name
    assert (root.stat().st_mode & 0o777, made.stat().st_mode & 0o777) == (0o700, 0o700)
    root.chmod(0o777)
    refused, problem = user_dir(create=True)
    assert refused is None and problem is not None
    assert problem == (
        f"guardian directory {root} is writable by others (mode 777): refusing to use it"
    )
