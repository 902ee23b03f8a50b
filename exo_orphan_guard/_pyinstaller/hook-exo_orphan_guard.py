"""Bundle every module of exo_orphan_guard: the package imports them lazily."""

from PyInstaller.utils.hooks import collect_submodules  # pyright: ignore[reportUnknownVariableType]

hiddenimports: list[str] = collect_submodules(
    "exo_orphan_guard", filter=lambda name: not name.startswith("exo_orphan_guard._pyinstaller")
)
