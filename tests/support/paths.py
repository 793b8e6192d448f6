"""Where the repository's files are, for the tests."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "dsv4.yaml"
CRD_PATH = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
MODEL_CRD_PATH = REPO / "crds" / "dsv4.io_dsv4models.yaml"
CRD_PATHS = (CRD_PATH, MODEL_CRD_PATH)
