"""A throw-away Python environment that the sweep takes for exo's own.

The fingerprint rule counts a spawn child as exo's runner only when its interpreter's
environment has exo installed (`exo_detect`). The demo and the tests need runners like
those of an exo install from before the guard, without installing exo: a venv whose
site-packages holds exo's dist-info (no exo code) and can import this package.
"""

from __future__ import annotations

import site
import sys
import sysconfig
import venv
from pathlib import Path

_PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def make_exo_environment(root: Path) -> str:
    """Create the environment at `root`; returns the path of its `python`."""
    venv.EnvBuilder(with_pip=False, symlinks=sys.platform != "win32").create(root)
    relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    site_packages = root / relative
    dist_info = site_packages / "exo-0.0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: exo\nVersion: 0.0.0\n")
    # This package and its dependencies (mlx included) come from the running environment.
    ours = [*site.getsitepackages(), str(_PACKAGE_PARENT)]
    lines = [f"import site; site.addsitedir({path!r})" for path in ours]
    (site_packages / "zz-exo-orphan-guard.pth").write_text("\n".join(lines) + "\n")
    return str(root / "bin" / "python")
