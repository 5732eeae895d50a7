"""dualsched: Slurm and Kubernetes side by side on one GPU fleet, as a Pulumi library.

Import it as ``dualsched.components`` and ``dualsched.config`` (and ``dualsched.policy``,
``dualsched.examples``). The checkout keeps the design's source layout, ``components/`` and ``config/``
at the root; an install maps them under this package (pyproject.toml, package-dir), so no top-level
``config`` or ``components`` lands in site-packages to collide with a project's own.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent

# In a checkout the subpackages are the root's folders: reach them from here, so one import path
# serves the checkout and the install alike.
if not (_HERE / "components").is_dir() and (_HERE.parent / "components").is_dir():
    __path__.append(str(_HERE.parent))


class _SourceFolderAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``components.X`` (a checkout's folder imported top-level, as ``python -m components.render`` does) is
    ``dualsched.components.X`` under a second name: the same module object, so nothing loads twice (two
    StackConfig classes, two registries of components)."""

    def __init__(self, folder: str):
        self.folder = folder

    def _target(self, name: str) -> str:
        return f"{__name__}.{name}"

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(f"{self.folder}."):
            real = importlib.util.find_spec(self._target(fullname))
            return real and importlib.util.spec_from_file_location(  # its file, for __file__ under runpy
                fullname, real.origin, loader=self, submodule_search_locations=real.submodule_search_locations)
        return None

    def create_module(self, spec):
        return importlib.import_module(self._target(spec.name))

    def exec_module(self, module) -> None:
        pass  # already executed under its dualsched name

    def get_code(self, fullname):  # runpy: `python -m components.render` runs the real module's code as __main__
        real = importlib.util.find_spec(self._target(fullname))
        return real.loader.get_code(real.name)


def alias_source_folder(folder: str) -> None:
    """Make the top-level ``folder`` package and its modules the ``dualsched.<folder>`` ones."""
    if not any(isinstance(f, _SourceFolderAlias) and f.folder == folder for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFolderAlias(folder))
    sys.modules[folder] = importlib.import_module(f"{__name__}.{folder}")
