"""Outcomes a worker holds on local disk until the service has accepted them.

A job's result costs GPU hours; the service may be away (restarting, its database failing
over) at the moment the job ends, or the worker may be killed before its report went out. So
a worker writes each outcome here first (one small JSON file per trial, written atomically),
reports it, and deletes it once the service has answered: accepted, or refused because the
lease went to another worker meanwhile. A worker that starts again for the same study reports
what an earlier run of it left behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cubic.outcome import Outcome


def default_outbox() -> Path:
    """``$CUBIC_OUTBOX``, else ``$XDG_STATE_HOME/cubic/outbox`` (``~/.local/state/...``)."""
    if os.environ.get("CUBIC_OUTBOX"):
        return Path(os.environ["CUBIC_OUTBOX"])
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "cubic" / "outbox"


class Outbox:
    """Pending reports of one service's studies, one file per trial."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _file(self, study_id: int, trial_id: int) -> Path:
        return self.path / f"study-{study_id}" / f"trial-{trial_id}.json"

    def put(self, study_id: int, lease: dict[str, Any], outcome: Outcome) -> None:
        """Keep ``outcome`` of the trial ``lease`` holds, durably, before it is reported."""
        target = self._file(study_id, int(lease["id"]))
        target.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "lease": {
                k: lease[k] for k in ("id", "number", "attempt", "lease_token") if k in lease
            },
            "outcome": asdict(outcome),
        }
        tmp = target.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    def pending(self, study_id: int) -> list[tuple[dict[str, Any], Outcome]]:
        """What an earlier run left unreported for this study (unreadable files are skipped,
        not fatal: a crash mid-write leaves only a ``.tmp``)."""
        folder = self.path / f"study-{study_id}"
        out = []
        for f in sorted(folder.glob("trial-*.json")) if folder.is_dir() else []:
            try:
                record = json.loads(f.read_text())
                out.append((record["lease"], Outcome(**record["outcome"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def done(self, study_id: int, trial_id: int) -> None:
        """The service has answered for this trial: forget it."""
        self._file(study_id, trial_id).unlink(missing_ok=True)
