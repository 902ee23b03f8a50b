"""What lands in exo: the worker's hooks, the patch series and the tools that apply it."""
