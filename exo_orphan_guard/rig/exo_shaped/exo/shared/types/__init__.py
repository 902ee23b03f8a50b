"""exo.shared.types, as far as the stand-in goes."""
