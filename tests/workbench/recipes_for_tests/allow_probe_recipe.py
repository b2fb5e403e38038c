"""A test recipe that builds one component, `thing:`, and records what it built as a `probe` event.

    torchrun --standalone --nproc_per_node 1 -m allow_probe_recipe --config FILE

(with this folder on PYTHONPATH). It shows which allow-list the run's own process gets: a component
the user allowed at registration (`--allow-component`) builds here only when the launcher handed the
grant on. A refused component is one line on stderr and exit 2.
"""

from __future__ import annotations

import os
import sys

from engine.config import ConfigError, instantiate, load_config_from_argv
from engine.tracking import MetricLogger


def main() -> int:
    try:
        cfg = load_config_from_argv()
        built = instantiate(cfg["thing"])
    except ConfigError as exc:
        print(f"allow_probe_recipe: {exc}", file=sys.stderr)
        return 2
    log = MetricLogger.from_env(rank=int(os.environ.get("RANK", "0")))
    log.event(0, "probe", f"built {built!r}")
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
