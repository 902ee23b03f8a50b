"""The guardian: one process per user per machine that ends the runners of every exo
process of that user that dies, from outside exo (`exo-orphan-guard service run`)."""
