"""The one build step pyproject.toml cannot say: the wheel's component package runs in the venv it is installed in.

``package/PulumiPlugin.yaml`` runs the provider in a checkout's ``.venv``. The wheel installs ``package/`` as
``<venv>/lib/pythonX.Y/site-packages/dualsched/package``; there the plugin's python is the venv's own, five
directories up (Pulumi resolves ``virtualenv`` relative to the plugin directory). ``dualsched-package-dir``
checks that it is, and prints the directory (docs/component-package.md).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

INSTALLED_PLUGIN = """\
# dualsched as a Pulumi component package, as pip installed it (docs/component-package.md):
#   dualsched-package-dir                                # prints this directory
#   packages: {dualsched: <that directory>}              (a Pulumi YAML project's Pulumi.yaml)
#   pulumi package get-schema <that directory>
# The provider runs in the virtual environment dualsched is installed in:
# <venv>/lib/pythonX.Y/site-packages/dualsched/package -> ../../../../.. is <venv>.
runtime:
  name: python
  options:
    virtualenv: ../../../../..
"""


class BuildPy(build_py):
    def build_package_data(self) -> None:
        super().build_package_data()
        if self.editable_mode:  # an editable install runs the checkout's package/ (its own PulumiPlugin.yaml)
            return
        target = Path(self.build_lib, "dualsched", "package", "PulumiPlugin.yaml")
        target.unlink(missing_ok=True)
        target.write_text(INSTALLED_PLUGIN)


setup(cmdclass={"build_py": BuildPy})
