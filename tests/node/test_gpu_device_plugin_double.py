"""The GPU device plugin double's own Go tests (tools/gosrc/gpu-device-plugin-double): the host's device
files, registration, ListAndWatch, Allocate, preferred allocation and re-registration against a fake
kubelet. The real kubelet uses it in test_real_node.py; these pin its contract where a failure is easier
to read. And its build: a change of its sources rebuilds the cached binary, and the node runs that one."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.node

TOOLS = Path(__file__).resolve().parents[2] / "tools"
SOURCES = TOOLS / "gosrc" / "gpu-device-plugin-double"


def test_the_double_passes_gofmt_vet_and_its_go_tests(tmp_path):
    result = subprocess.run(
        ["bash", str(SOURCES / "build.sh"), str(tmp_path / "gpu-device-plugin-double")],
        env={**os.environ, "RUN_TESTS": "1"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for test in ("TestIndex", "TestDeviceNodes", "TestOpeningADeviceWithoutDriverGivesENXIO", "TestPluginWithFakeKubelet"):
        assert f"--- PASS: {test}" in result.stdout, result.stdout[-3000:]
    assert "FAIL" not in result.stdout and "SKIP" not in result.stdout, result.stdout[-3000:]


def src_hash(tools: Path) -> str:
    """build-tools.sh's cache key of the double's sources, computed by its own src_hash."""
    script = (TOOLS / "build-tools.sh").read_text()
    function = re.search(r"^src_hash\(\) \{.*?^\}$", script, re.MULTILINE | re.DOTALL).group(0)
    result = subprocess.run(["bash", "-c", f'HERE="$1"; {function}\nsrc_hash gpu-device-plugin-double', "bash", str(tools)],
                            capture_output=True, text=True, check=True)  # fmt: skip
    return result.stdout.strip()


def test_a_change_of_the_doubles_sources_or_build_changes_its_cache_key(tmp_path):
    copy = tmp_path / "tools"
    shutil.copytree(SOURCES, copy / "gosrc" / "gpu-device-plugin-double")
    first = src_hash(copy)
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    build = copy / "gosrc" / "gpu-device-plugin-double" / "build.sh"
    build.write_text(build.read_text().replace("KUBELET_MODULE_VERSION=v0.36.3", "KUBELET_MODULE_VERSION=v0.36.4"))
    second = src_hash(copy)
    plugin = copy / "gosrc" / "gpu-device-plugin-double" / "plugin.go"
    plugin.write_text(plugin.read_text() + "\n// changed\n")
    assert len({first, second, src_hash(copy)}) == 3


def test_the_node_starts_the_double_of_the_pinned_version():
    versions = dict(re.findall(r"^(\w+)=(\S+)", (TOOLS / "versions.env").read_text(), re.MULTILINE))
    node = (TOOLS / "node.sh").read_text()
    assert 'bin_of gpu-device-plugin-double "$GPU_DEVICE_PLUGIN_DOUBLE_VERSION"' in node
    assert versions["GPU_DEVICE_PLUGIN_DOUBLE_VERSION"] != "v1"  # v1 made <dir>/gpuK, not the host's /dev/nvidiaK
