"""The dualsched component provider: the engine runs `python package <engine address> ...` (PulumiPlugin.yaml)."""

import sys
from pathlib import Path

# The library is the checkout this directory sits in (components/, config/, package/), not an installed
# package. The checkout replaces this directory on the path, so none of its modules shadows another.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from package.cluster import serve  # noqa: E402

if __name__ == "__main__":
    serve(sys.argv[1:])
