"""The examples in examples/ deploy what the README says they do (rendered under Pulumi mocks), so they cannot rot.

Each row of the README's examples table is rendered with its own command line, then checked
against the row (slurmd pools, model servers) and against what a cluster needs to run it: the
nodes every slurmd DaemonSet and model server selects carry the labels it selects on, and
slurm.conf's AccountingStorageHost is a slurmdbd the program deploys, or accounting is off.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

from dualsched.components import render as render_module
from dualsched.components.node_keeper import STATE_FILE
from dualsched.components.program import build
from dualsched.components.render import Render, RenderedObject, render_config
from dualsched.config import ConfigError, ConfigKey, load_stack_file, parse_stack_config
from dualsched.examples.own_program import slurm_only
from dualsched.examples.sbatch_job import TRAINING_SCRIPT, job_identity, program, submit_training_job
from rendering import raw_stack

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
NAME_LABEL = "app.kubernetes.io/name"
MODEL_SERVERS = ("vllm", "triton")
EXAMPLE_ROW = re.compile(r"^\| (?P<example>.+?) \| `(?P<command>python -m dualsched\.components\.render [^`]+)` \| (?P<deploys>.+) \|$", re.M)


def _readme_examples() -> dict[str, dict[str, str]]:
    rows = {}
    for row in EXAMPLE_ROW.finditer(README):
        [name] = re.findall(r"\[([^\]]+\.(?:py|yaml))\]", row["example"])[:1]
        rows[name] = row.groupdict()
    return rows


EXAMPLES = _readme_examples()


def test_the_readme_lists_every_example():
    files = {path.name for path in (ROOT / "examples").iterdir() if path.suffix in (".py", ".yaml") and path.name != "__init__.py"}
    listed = {name for row in EXAMPLES.values() for name in re.findall(r"\[([^\]]+\.(?:py|yaml))\]", row["example"])}
    assert files == listed


def _run_readme_command(command: str, out: Path, monkeypatch) -> Render:
    """The row's command, in-process from the repository root, keeping the Render it made."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "dualsched.components.render"]
    renders = []
    original = render_module.render_config

    def capture(*args, **kwargs):
        renders.append(original(*args, **kwargs))
        return renders[-1]

    monkeypatch.setattr(render_module, "render_config", capture)
    monkeypatch.chdir(ROOT)
    arguments = argv[3:]
    arguments[arguments.index("--out") + 1] = str(out)
    assert render_module.main(arguments) == 0
    [render] = renders
    return render


def _count(deploys: str, what: str) -> int:
    [number] = re.findall(rf"(\d+) {what}", deploys)
    return int(number)


def _role(obj: RenderedObject) -> str:
    return obj.manifest["spec"]["template"]["metadata"]["labels"].get(NAME_LABEL, "")


def slurmd_pools(render: Render) -> list[RenderedObject]:
    return [obj for obj in render.by_kind("DaemonSet") if _role(obj) == "slurmd"]


def model_servers(render: Render) -> list[RenderedObject]:
    return [obj for obj in render.by_kind("Deployment") if _role(obj) in MODEL_SERVERS]


def _node_labels(render: Render) -> dict[str, Mapping[str, str]]:
    """Node -> the labels the node keeper's desired state gives it."""
    [keeper] = [c for c in render.by_kind("ConfigMap") if STATE_FILE in (c.manifest.get("data") or {})]
    return {node: pool["labels"] for pool in json.loads(keeper.manifest["data"][STATE_FILE])["pools"] for node in pool["nodes"]}


def selected_nodes(workload: RenderedObject, nodes: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The labelled nodes the workload's pods may run on: its nodeSelector, and every required affinity term."""
    pod = workload.manifest["spec"]["template"]["spec"]
    selector = pod.get("nodeSelector") or {}
    terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    expressions = [e for term in terms.get("nodeSelectorTerms") or [] for e in term.get("matchExpressions") or []]

    def matches(labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items()) and all(
            e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in expressions
        )

    return {name for name, labels in nodes.items() if matches(labels)}


def _stack_config(row: Mapping[str, str]):
    argv = shlex.split(row["command"])
    path = ROOT / argv[argv.index("--stack-file") + 1] if "--stack-file" in argv else ROOT / f"Pulumi.{argv[argv.index('--stack') + 1]}.yaml"
    document = yaml.safe_load(path.read_text())
    key = ConfigKey.parse(argv[argv.index("--config-key") + 1]) if "--config-key" in argv else None
    if key is None and not any(k.startswith("dualsched:") for k in document["config"]):
        [only] = document["config"]  # a program that reads its own key
        key = ConfigKey.parse(only)
    return load_stack_file(path, key or ConfigKey())


_RENDERS: dict[str, Render] = {}


def rendered_example(name: str, tmp_path_factory) -> tuple[dict[str, str], Render]:
    """An example's README row and its render by the row's command (once per session)."""
    row = EXAMPLES[name]
    if name not in _RENDERS:
        monkeypatch = pytest.MonkeyPatch()
        try:
            _RENDERS[name] = _run_readme_command(row["command"], tmp_path_factory.mktemp("example"), monkeypatch)
        finally:
            monkeypatch.undo()
    return row, _RENDERS[name]


@pytest.fixture(params=sorted(EXAMPLES))
def example(request, tmp_path_factory) -> tuple[dict[str, str], Render]:
    return rendered_example(request.param, tmp_path_factory)


def test_the_examples_deploy_the_slurmd_pools_and_model_servers_the_readme_counts(example):
    row, render = example
    assert len(slurmd_pools(render)) == _count(row["deploys"], "slurmd pools?")
    assert len(model_servers(render)) == _count(row["deploys"], "model servers?")


def test_every_slurmd_pool_selects_exactly_its_pools_labelled_nodes(example):
    row, render = example
    config = _stack_config(row)
    nodes = _node_labels(render)
    for daemonset in slurmd_pools(render):
        pool = config.pool(daemonset.manifest["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"])
        assert selected_nodes(daemonset, nodes) == set(pool.node_names), daemonset.name


def test_every_model_server_may_run_on_labelled_nodes_of_its_pools(example):
    row, render = example
    config = _stack_config(row)
    nodes = _node_labels(render)
    eligible = {node for pool in config.inference_pools for node in pool.node_names}
    for server in model_servers(render):
        assert selected_nodes(server, nodes) == eligible != set(), server.name


def _setting(conf: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(\S+)$", conf, re.M)


def test_slurm_conf_names_a_slurmdbd_the_example_deploys_or_accounting_is_off(example):
    row, render = example
    conf = render.slurm_files.get("slurm.conf", "")
    slurmdbd = [obj for obj in render.objects if obj.kind in ("Deployment", "StatefulSet") and _role(obj) == "slurmdbd"]
    hosts = _setting(conf, "AccountingStorageHost")
    if not hosts:
        assert not slurmdbd and not _setting(conf, "AccountingStorageType")
        return
    [host] = hosts
    service, namespace = host.removesuffix(".svc.cluster.local").split(".")
    [deployed] = [s for s in render.by_kind("Service") if s.name == service and s.namespace == namespace]
    [workload] = slurmdbd
    assert workload.namespace == namespace
    selector = deployed.manifest["spec"]["selector"]
    assert all(workload.manifest["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in selector.items())


def test_the_examples_cover_accounting_on_and_off():
    configs = [_stack_config(row) for row in EXAMPLES.values()]
    accounting = {c.slurm.accounting.enabled for c in configs if c.slurm is not None}
    assert accounting == {True, False}


def test_the_inference_only_example_builds_no_slurm(tmp_path_factory):
    row, render = rendered_example("Pulumi.inference-only.yaml", tmp_path_factory)
    assert _stack_config(row).slurm is None
    assert not render.slurm_files and not slurmd_pools(render)
    # no lock, munge or JWT key: only the random part of the shared claims' names
    assert {r.type for r in render.registrations if r.type.startswith("random:")} == {"random:index/randomString:RandomString"}
    assert {n.name for n in render.by_kind("Namespace")} == {"inference"}


# --------------------------------------------------------------- own_program.py


def _own_raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "Pulumi.own-program.yaml").read_text())["config"]["training:cluster"]


def test_own_program_reads_its_own_key_or_takes_the_config_alike(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    base = ["--stack-file", "examples/Pulumi.own-program.yaml"]
    assert render_module.main([*base, "--program", "dualsched.examples.own_program:main", "--out", str(tmp_path / "reads")]) == 0
    assert render_module.main([*base, "--config-key", "training:cluster", "--program", "dualsched.examples.own_program:slurm_only",
                               "--out", str(tmp_path / "given")]) == 0
    read = lambda root: {p.relative_to(root): p.read_text() for p in root.rglob("*.yaml")}
    assert read(tmp_path / "reads") == read(tmp_path / "given") != {}


def test_own_program_waits_for_the_cluster_name_lock():
    render = render_config(parse_stack_config(_own_raw()), "example", program=slurm_only)
    [lock] = [r for r in render.registrations if r.type == "random:index/randomId:RandomId"]
    [cluster] = [r for r in render.registrations if r.type == "examples:own_program:TrainingCluster"]
    assert lock.protect and lock.urn in cluster.dependencies


@pytest.mark.parametrize("edit, path", [
    (lambda raw: raw.update(submission={"enabled": True}), "submission.enabled"),
    (lambda raw: raw.update(inference={"models": [{"name": "m", "path": "m"}]},
                            pools=[{**raw["pools"][0]}, {"name": "serve", "nodes": "gpu-[101-102]", "mode": "kubernetes"}]),
     "inference.models"),
])
def test_own_program_refuses_what_it_does_not_build(edit, path):
    raw = _own_raw()
    edit(raw)
    with pytest.raises(ConfigError) as caught:
        slurm_only(parse_stack_config(raw))
    assert [problem.path for problem in caught.value.problems] == [path]


def test_own_program_as_a_pulumi_program_stops_with_a_run_error(tmp_path, monkeypatch, capsys):
    raw = _own_raw()
    raw["submission"] = {"enabled": True}
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text(yaml.safe_dump({"config": {"training:cluster": raw}}))
    monkeypatch.chdir(ROOT)
    assert render_module.main(["--stack-file", str(stack), "--program", "dualsched.examples.own_program:main", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "submission.enabled: this program deploys no job submission from Kubernetes: set it false (got True)" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_own_program_on_a_stack_without_its_key_stops_with_pulumis_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert render_module.main(["--stack", "dev", "--program", "dualsched.examples.own_program:main", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("program dualsched.examples.own_program:main stopped:\n")
    assert "Missing required configuration variable 'training:cluster'" in err and "Traceback" not in err


# ------------------------------------------------------------------ sbatch_job.py


def _config_with_identities(*identities, users=({"name": "alice", "uid": 2001},)):
    raw = raw_stack("dev")
    raw["slurm"]["users"] = list(users)
    raw["slurm"]["login"] = {"enabled": False}  # dev's names alice
    raw["submission"] = {"identities": list(identities)}
    return parse_stack_config(raw)


def test_sbatch_job_submits_through_the_submission_namespace():
    config = _config_with_identities({"serviceAccount": "trainer", "user": "alice"})
    render = render_config(config, "example", program=program)
    job = render.one("Job").manifest
    assert job["metadata"]["namespace"] == config.submission.namespace
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    sbatch = pod["containers"][0]
    assert sbatch["command"][:2] == ["bash", "/opt/dualsched/sbatch_wait.sh"]
    assert {"name": "BATCH_SCRIPT", "value": TRAINING_SCRIPT} in sbatch["env"]
    assert pod["initContainers"][0]["name"] == "slurm-token"
    assert pod["securityContext"]["runAsUser"] == sbatch["securityContext"]["runAsUser"] == 2001


def test_sbatch_job_submits_as_the_first_identity():
    config = _config_with_identities(
        {"serviceAccount": "pipelines", "user": "carol"}, {"serviceAccount": "notebooks", "user": "dave"},
        users=({"name": "carol", "uid": 4001, "gid": 4500}, {"name": "dave", "uid": 4002}),
    )
    assert job_identity(config).service_account == "pipelines"
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c), c))
    pod = render.one("Job").manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pipelines"
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 4001
    assert pod["containers"][0]["securityContext"]["runAsGroup"] == 4500


def test_sbatch_job_without_identities_is_a_clear_error():
    config = _config_with_identities()
    with pytest.raises(ValueError, match="maps no ServiceAccount"):
        job_identity(config)


def test_sbatch_job_without_submission_is_a_clear_error():
    raw = raw_stack("dev")
    raw["submission"] = {"enabled": False}
    with pytest.raises(ValueError, match="deploys no job submission"):
        render_config(parse_stack_config(raw), "example", program=program)


def test_dev_stack_has_an_identity_for_the_example():
    assert job_identity(load_stack_file(ROOT / "Pulumi.dev.yaml")).user == "alice"


def test_the_readmes_own_program_renders_from_its_own_key(tmp_path, monkeypatch):
    """The README's infra.py, as written, under the offline render: config at gpu:cluster, its own provider."""
    [code] = re.findall(r"```python\n(# infra\.py.*?)```", README, re.S)
    (tmp_path / "infra.py").write_text(code)
    (tmp_path / "Pulumi.yaml").write_text("name: training\nruntime: python\n")
    stack = tmp_path / "Pulumi.gpu.yaml"
    stack.write_text(yaml.safe_dump({"config": {"gpu:cluster": raw_stack("dev"), "gpu:kubeconfig": "apiVersion: v1\nkind: Config\n"}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert render_module.main(["--stack", "gpu", "--program", "infra:main", "--out", str(tmp_path / "out")]) == 0
    assert any((tmp_path / "out" / "slurm").glob("statefulset-*.yaml"))
