"""A run's component grants: what the user widened the allow-list with, recorded when the run is registered.

`record(run_id, db)` writes one `allow` event at step 0 when the user granted prefixes
(`--allow-component`, `TUNEBENCH_ALLOW`, `TUNEBENCH_HOME/settings.yaml`; see `engine.config._grants`):

    allow: component allow-list widened by the user: mypkg.rewards (from --allow-component)

so `tunebench show RUN [--json]` says it. `launch_env(run_id, db)` turns that record back into the
`TUNEBENCH_ALLOW` of the run's processes, so a queued, resumed or workbench-launched run gets exactly
what it was registered with, whatever the environment of the process that launches it.
"""

from __future__ import annotations

import sqlite3

EVENT_KIND = "allow"
_PREFIX = "component allow-list widened by the user: "


def record(run_id: str, *, db: sqlite3.Connection) -> None:
    """One `allow` event naming each granted prefix and where it came from; nothing when none was."""
    from engine.config import describe_grants, user_grants
    from engine.tracking.run_rows import add_event

    grants = user_grants()
    if grants:
        add_event(run_id, 0, EVENT_KIND, _PREFIX + describe_grants(grants), db=db)


def recorded_prefixes(run_id: str, *, db: sqlite3.Connection) -> list[str]:
    """The prefixes the run was registered with (from its `allow` events), in order, each once."""
    from engine.config._grants import parse_granted
    from engine.tracking.readers import events_since

    out: list[str] = []
    for e in events_since(run_id, db=db):
        if e.kind == EVENT_KIND and e.text.startswith(_PREFIX):
            out += [p for p in parse_granted(e.text[len(_PREFIX) :]) if p not in out]
    return out


def launch_env(env: dict[str, str], run_id: str, *, db: sqlite3.Connection) -> dict[str, str]:
    """`env` with `TUNEBENCH_ALLOW` set to the run's recorded prefixes (removed when it has none)."""
    from engine.config._grants import ENV_VAR

    out = dict(env)
    prefixes = recorded_prefixes(run_id, db=db)
    if prefixes:
        out[ENV_VAR] = ",".join(prefixes)
    else:
        out.pop(ENV_VAR, None)
    return out


def current_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with `TUNEBENCH_ALLOW` set to this process's user grants (`--allow-component`, the
    environment, settings.yaml): for processes started without a registered run (another node of a
    multi-node run)."""
    from engine.config import user_prefixes
    from engine.config._grants import ENV_VAR

    out = dict(env)
    prefixes = user_prefixes()
    if prefixes:
        out[ENV_VAR] = ",".join(prefixes)
    return out
