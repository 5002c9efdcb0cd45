"""The service benchmark's measurements of a real API server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cubic.bench.service import api_rss_mib, api_server
from cubic.store.schema import upgrade


@pytest.mark.parametrize("workers", [1, 2])
def test_rss_is_read_for_each_api_process_and_its_background_process(
    tmp_path: Path, workers: int
) -> None:
    """Each API process starts one background process (proposing and fitting) beside it:
    the benchmark reports both, so that memory held off the request path is seen too."""
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    with api_server(db, workers, {"CUBIC_BACKGROUND": "process"}) as url:
        api = api_rss_mib(url)
        # Each starts its background process once serving; that one then imports cubic.
        deadline = time.monotonic() + 120
        while True:
            background = api_rss_mib(url, background=True)
            if len(background) == workers and all(m > 30 for m in background):
                break
            assert time.monotonic() < deadline, background
            time.sleep(0.5)
    assert len(api) == workers and all(m > 30 for m in api), api
    assert api_rss_mib("http://127.0.0.1:1") == []
