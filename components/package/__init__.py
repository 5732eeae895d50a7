"""dualsched as a Pulumi component package: `pulumi package add <checkout>/package` from TypeScript, Go,
YAML, ... (docs/component-package.md). The plugin directory is ``package/`` at the top of the checkout."""
