"""`steps_site` for `tests/helpers/app_quit.py`, and two things more.

On PYTHONPATH instead of `steps_site` (which it loads, and which works as before):

- with `EOG_STEPS_MODE=gil` (the wedged runner), SIGTERM is ignored from the runner's
  start: a runner SIGTERM cannot end, as one inside a kernel call is on a Mac (state
  U) until the call returns. (`steps_site` blocks signals on the main thread only;
  a process-directed SIGTERM then kills it through another thread.)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_STEPS = Path(__file__).resolve().parents[1] / "steps_site" / "sitecustomize.py"
_spec = importlib.util.spec_from_file_location("eog_steps_site", _STEPS)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))


if os.environ.get("EOG_STEPS_MODE") == "gil":
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
