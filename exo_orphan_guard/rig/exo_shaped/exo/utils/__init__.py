"""exo.utils, as far as the stand-in goes."""
