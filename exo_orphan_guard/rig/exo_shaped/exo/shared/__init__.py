"""exo.shared, as far as the stand-in goes."""
