"""dualsched policy: the cluster's invariants (rules.py), as a CrossGuard pack (__main__.py)
and as an offline check over the rendered program (offline.py)."""
