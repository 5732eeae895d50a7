"""dualsched as a Pulumi component package (docs/component-package.md).

This directory is the plugin (PulumiPlugin.yaml, runtime python): `pulumi package add <checkout>/package`
from TypeScript, Go, YAML, ... The modules: cluster.py (the component and the provider), config_types.py
(the input schema, generated from config/models.py by gen_types.py).
"""
