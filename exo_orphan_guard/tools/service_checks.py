"""What `service install`, `uninstall` and `status` refuse, decided by pure functions,
each reason one line that says what to run instead.

A service is one user's: it guards that user's exo and runs that user's copy of the
CLI. Installed as root into a user's home (macOS's sudo keeps `HOME`), it would be a
root job running a program the user can change, at every login, and would leave
root-owned files where the user's own guardian and exo must write. A system-wide
daemon is no answer either: it would end every user's runners from one process, and
need its own root-owned copy of the CLI. So root is refused unless the home is
root's own, with the command that does it as the user.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence

from .service_files import Manager


def root_problem(
    manager: Manager,
    uid: int,
    home_owner: int | None,
    environ: Mapping[str, str],
    name_of: Callable[[int], str | None],
    cli: Sequence[str],
    command: str,
) -> str | None:
    """Why `service <command>` must not run as root here: the user it would act for
    (sudo's `SUDO_UID`, else the home's owner) is not root."""
    if uid != 0:
        return None
    sudo = environ.get("SUDO_UID", "")
    user = int(sudo) if sudo.isdigit() and int(sudo) != 0 else home_owner
    if user is None or user == 0:
        return None
    name = name_of(user)
    words = shlex.join((*cli, "service", command))
    who = name if name is not None else f"#{user}"
    if manager == "launchd":
        from_root = f"launchctl asuser {user} sudo -u {shlex.quote(who)} {words}"
    else:
        from_root = f"sudo -u {shlex.quote(who)} env XDG_RUNTIME_DIR=/run/user/{user} {words}"
    person = name if name is not None else f"uid {user}"
    why = (
        f"installed by root it would run a program {person} can change with root's rights, "
        f"and leave root-owned files in {person}'s home"
        if command == "install"
        else f"it is {person}'s, known to {person}'s {manager}, not root's"
    )
    return (
        f"refusing to run as root for {person}: the guardian's service is {person}'s own "
        f"({why}); run `{words}` as {person}, without sudo (from a root shell: `{from_root}`)"
    )
