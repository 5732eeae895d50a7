"""A Pulumi secret in the stack config under the real CLI and engine (issue 12, item 4).

`pulumi config set --secret --path` encrypts one value in the stack file and makes its whole top-level
key secret; the program must accept it, the offline tools must read the file, and the plain text must
appear nowhere. Previews only, like test_policy_pack_engine.py: nothing changes in the cluster, and the
tests can run in any order with test_engine.py.
"""

from __future__ import annotations

import pytest
import yaml
from pulumi import automation as auto

from dualsched.config import load_stack_file
from e2e_support import Steps, World, raw_config

pytestmark = pytest.mark.e2e

STACK = "secret-config"
PASSWORD = "e2e-Secret-Pass-7f3k"
PASSWORD_KEY = "dualsched:slurm.accounting.database.external.password"


def test_a_password_set_with_config_set_secret_validates_and_stays_secret(world: World):
    raw = raw_config("dev")
    raw["slurm"]["accounting"]["database"] = {"mode": "external", "external": {"host": "acct-db.example.internal"}}
    stack = world.stack(STACK, raw)
    try:
        stack.set_config(PASSWORD_KEY, auto.ConfigValue(PASSWORD, secret=True), path=True)

        # The stack file holds the password encrypted, and the offline tools read it as a placeholder.
        path = world.project / f"Pulumi.{STACK}.yaml"
        text = path.read_text()
        external = yaml.safe_load(text)["config"]["dualsched:slurm"]["accounting"]["database"]["external"]
        assert list(external["password"]) == ["secure"] and PASSWORD not in text
        assert load_stack_file(path).slurm.accounting.database.external.password.encrypted

        # The CLI now treats the whole dualsched:slurm key as a secret, and the program accepts it.
        assert stack.get_config("dualsched:slurm").secret
        steps = Steps()
        result = stack.preview(on_event=steps, color="never")
        assert any(urn.endswith("kubernetes:core/v1:Secret::dualsched-accounting-db-password") for urn in steps.ops())
        assert PASSWORD not in result.stdout + result.stderr
        assert PASSWORD not in str(steps.steps)
    finally:
        stack.workspace.remove_stack(STACK, force=True)
