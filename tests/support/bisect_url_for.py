"""`dsv4 bisect --url-for` for the tests: start one engine double serving the probe spec's
configuration and print its base URL.

    python tests/support/bisect_url_for.py PROBE.yaml

The double runs the spec's rendered prefill argv and env (engine/flags.py: HiCache renders on
prefill), answering chat itself (`--disaggregation-mode null`), with the image's capabilities
and release, at a declared load of 60 (the incident's concurrency), detached so it outlives
this script; its pid is appended to `pids` next to the spec file, for the test to
stop it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.flags import ENGINE_ENTRYPOINT, engine_launch, served_name
from dsv4_operator.engine.planner import plan

LISTENING = re.compile(r"Uvicorn running on http://([^:\s]+):(\d+)")
DECLARED_LOAD = "60"


def main(spec_file: Path) -> None:
    doc = yaml.safe_load(spec_file.read_text())
    spec = DSV4DeploymentSpec.model_validate(doc["spec"])
    the_plan = plan(spec)
    launch = engine_launch(
        spec, the_plan, "prefill", served_name(spec, the_plan.profiles.model.served_name)
    )
    argv = [
        *launch.command[len(ENGINE_ENTRYPOINT) :],
        *("--disaggregation-mode", "null", "--host", "127.0.0.1", "--port", "0"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "DSV4_DOUBLE_"))}
    env.update(dict(launch.env))
    env.update(
        {
            "DSV4_DOUBLE_CAPABILITIES": ",".join(spec.engine.capabilities),
            "DSV4_DOUBLE_SGLANG_VERSION": spec.engine.sglang_version,
            "DSV4_DOUBLE_LOAD": DECLARED_LOAD,
            "DSV4_DOUBLE_LATENCY_MS": "2",
        }
    )
    log = spec_file.with_suffix(".log")
    with log.open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "dsv4_engine_double", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    with (spec_file.parent / "pids").open("a") as pids:
        pids.write(f"{child.pid}\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = LISTENING.search(log.read_text())
        if match:
            print(f"http://127.0.0.1:{match.group(2)}")
            return
        if child.poll() is not None:
            break
        time.sleep(0.1)
    sys.exit(f"the engine double did not start:\n{log.read_text()}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
