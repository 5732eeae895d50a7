"""The GPU device plugin double's own Go tests (tools/gosrc/gpu-device-plugin-double): registration,
ListAndWatch, Allocate, preferred allocation and re-registration against a fake kubelet. The real
kubelet uses it in test_real_node.py; these pin its contract where a failure is easier to read."""

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.node

SOURCES = Path(__file__).resolve().parents[2] / "tools" / "gosrc" / "gpu-device-plugin-double"


def test_the_double_passes_gofmt_vet_and_its_go_tests(tmp_path):
    result = subprocess.run(
        ["bash", str(SOURCES / "build.sh"), str(tmp_path / "gpu-device-plugin-double")],
        env={**os.environ, "RUN_TESTS": "1"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "--- PASS: TestPluginWithFakeKubelet" in result.stdout and "FAIL" not in result.stdout
