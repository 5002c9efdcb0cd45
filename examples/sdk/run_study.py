"""Drive a study from Python with the SDK: submit a study file, run its trials here on the
simulated cluster (the loop a worker runs), and print the best configuration.

    cubic db upgrade && cubic serve &                  # a service on 127.0.0.1:8000
    python examples/sdk/run_study.py search_spaces/llama3_8b.study.yaml

With authentication on, set CUBIC_TOKEN to a submitter token (for the study) that is also
allowed to run trials, or an admin token; CUBIC_URL picks another service.
"""

from __future__ import annotations

import os
import sys
import time

from cubic.client import CubicClient
from cubic.sim.job import run_job
from cubic.workload import Workload


def main(study_file: str) -> None:
    url = os.environ.get("CUBIC_URL", "http://127.0.0.1:8000")
    with CubicClient(url) as client:
        study = client.create_study_from_file(study_file)
        print(f"study {study['id']}: {study['name']}")
        workload = Workload.from_dict(study["spec"]["workload"])
        while True:
            leased = client.lease(study["id"], worker_id="sdk-example", count=4)
            if not leased:
                if client.get_study(study["id"])["state"] != "running":
                    break
                time.sleep(0.2)  # the last trials are still running elsewhere
                continue
            for trial in leased:
                outcome = run_job(workload, trial["params"], seed=trial["id"])
                client.report(
                    trial["id"],
                    trial["lease_token"],
                    outcome.state,
                    metrics=outcome.metrics,
                    error=outcome.error,
                )
                print(f"trial {trial['number']}: {outcome.state}")
        best = client.best(study["id"])
        print(f"best {best['metric']}: {best['value']:,.0f}")
        for knob, value in best["trial"]["params"].items():
            print(f"  {knob}: {value}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "search_spaces/llama3_8b.study.yaml")
