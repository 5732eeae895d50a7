"""The dualsched component provider: the engine runs `python package <engine address> ...` (PulumiPlugin.yaml)."""

import sys
from pathlib import Path

# The library is the checkout this directory sits in (components/, config/), not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.package.cluster import serve  # noqa: E402

if __name__ == "__main__":
    serve(sys.argv[1:])
