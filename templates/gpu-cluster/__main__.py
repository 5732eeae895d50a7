"""`pulumi up --stack <name>` builds the cluster that Pulumi.<name>.yaml describes (infra.build)."""

import pulumi

from dualsched.config import ConfigError, load_pulumi_config
from infra import build

try:
    config = load_pulumi_config()  # the stack's dualsched:* keys, validated
except ConfigError as error:
    # A config mistake is the user's to fix: every problem, no traceback, nothing registered.
    raise pulumi.RunError(str(error)) from None

build(config)
