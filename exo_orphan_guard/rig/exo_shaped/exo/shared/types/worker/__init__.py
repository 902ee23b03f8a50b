"""exo.shared.types.worker, as far as the stand-in goes."""
