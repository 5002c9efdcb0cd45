"""The worker's outbox: outcomes kept on disk until the service has answered for them."""

from __future__ import annotations

from pathlib import Path

from cubic.outbox import Outbox, default_outbox
from cubic.outcome import Outcome


def test_put_pending_done_and_a_torn_write(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "ob")
    lease = {"id": 7, "number": 6, "attempt": 1, "lease_token": "tok", "params": {"tp": 2}}
    outcome = Outcome("complete", {"tokens_per_s": 1.5e4}, log_tail="done")
    box.put(3, lease, outcome)
    box.put(4, {**lease, "id": 8}, Outcome("infeasible", error="CUDA out of memory"))
    assert box.pending(3) == [({"id": 7, "number": 6, "attempt": 1, "lease_token": "tok"}, outcome)]
    # A crash mid-write leaves a temporary file or garbage: skipped, not fatal.
    (tmp_path / "ob" / "study-3" / "trial-9.json").write_text("{not json")
    (tmp_path / "ob" / "study-3" / "trial-10.tmp").write_text("{}")
    assert [lease for lease, _ in box.pending(3)] == [box.pending(3)[0][0]]
    box.done(3, 7)
    box.done(3, 7)  # twice: nothing left, no error
    assert box.pending(3) == [] and len(box.pending(4)) == 1
    assert Outbox(tmp_path / "nowhere").pending(1) == []


def test_default_location(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUBIC_OUTBOX", str(tmp_path / "x"))
    assert default_outbox() == tmp_path / "x"
    monkeypatch.delenv("CUBIC_OUTBOX")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_outbox() == tmp_path / "state" / "cubic" / "outbox"
