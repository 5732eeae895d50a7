"""dualsched's Pulumi components, one module per component (import them as dualsched.components)."""

# The checkout's components/ is the source of dualsched.components. Imported top-level (`python -m components.<tool>` in a
# checkout), it and its modules are the dualsched.components ones under a second name, never a second copy.
if __name__ != "dualsched.components":
    import dualsched

    dualsched.alias_source_folder(__name__)
