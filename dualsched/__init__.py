"""dualsched: Slurm and Kubernetes side by side on one GPU fleet, as a Pulumi library.

Import it as ``dualsched.components`` and ``dualsched.config`` (and ``dualsched.policy``,
``dualsched.examples``). The checkout keeps the design's source layout, ``components/`` and ``config/``
at the root; an install maps them under this package (pyproject.toml, package-dir), so no top-level
``config`` or ``components`` lands in site-packages to collide with a project's own.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

# In a checkout the subpackages are the root's folders: reach them from here, so one import path
# serves the checkout and the install alike.
if not (_HERE / "components").is_dir() and (_HERE.parent / "components").is_dir():
    __path__.append(str(_HERE.parent))
