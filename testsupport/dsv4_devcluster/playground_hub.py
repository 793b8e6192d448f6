"""``python -m dsv4_devcluster.playground_hub``: the stand-in Hub (:mod:`.hub`) as a command.

It serves small model repos under the names deployments use (a config and one safetensors
file each: a STAND-IN for the Hugging Face Hub, not its weights) and prints its endpoint and
the repos, one per line, until interrupted. The playground starts it and points the weights
download Job's ``HF_ENDPOINT`` at it.
"""

from __future__ import annotations

import argparse
import sys

from dsv4_devcluster.hub import HubRepo, StandInHub
from dsv4_devcluster.process import stop_on_signals

DEFAULT_REPOS = ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V3.2")
WEIGHT_BYTES = 300_000


def repo_files(name: str) -> dict[str, bytes]:
    """A repo's files: a config and one safetensors file whose bytes name the repo."""
    seed = name.encode()
    weights = (seed * (WEIGHT_BYTES // len(seed) + 1))[:WEIGHT_BYTES]
    return {
        "config.json": b'{"model_type": "stand-in"}',
        "model-00001-of-00001.safetensors": weights,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dsv4_devcluster.playground_hub",
        description="Serve small stand-in model repos with the Hugging Face Hub's download API "
        "on 127.0.0.1 (a test double: no real weights) until interrupted.",
    )
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument(
        "--repo",
        action="append",
        metavar="ORG/NAME",
        help=f"a repo to serve (repeatable; default: {', '.join(DEFAULT_REPOS)})",
    )
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    repos = {name: HubRepo(repo_files(name)) for name in args.repo or DEFAULT_REPOS}
    with StandInHub(repos, port=args.port) as hub:
        print(f"endpoint {hub.endpoint}", flush=True)
        for name, repo in repos.items():
            size = sum(len(data) for data in repo.files.values())
            print(f"repo {name}@{'|'.join(repo.revisions)}: {len(repo.files)} files, {size} bytes")
        print("serving", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
