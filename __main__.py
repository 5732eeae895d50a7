"""dualsched: `pulumi up --stack <name>` builds the cluster described by Pulumi.<name>.yaml."""

import pulumi

from dualsched.components.program import build
from dualsched.config import ConfigError, load_pulumi_config

try:
    config = load_pulumi_config()
except ConfigError as error:
    # A config mistake is the user's to fix: every problem, no traceback, nothing registered.
    raise pulumi.RunError(str(error)) from None

build(config)
