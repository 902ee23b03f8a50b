"""exo's runner bootstrap, as much as the PR's modules read: the runner's logger."""

import loguru

logger: "loguru.Logger" = loguru.logger
