"""dualsched's Pulumi components, one module per component (import them as dualsched.components)."""

# The checkout's components/ is the source of dualsched.components; imported top-level too, its modules would load
# twice (two StackConfig classes, two registries of components), so that import is refused.
if __name__ != "dualsched.components":
    raise ImportError(f"import dualsched.components, not {__name__}: components/ is its source folder")
