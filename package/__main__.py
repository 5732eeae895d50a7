"""The dualsched component provider: the engine runs ``python -u <this directory> <engine address>``, with the
python of PulumiPlugin.yaml's ``virtualenv`` (the venv dualsched is installed in, or a checkout's .venv)."""

import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "dualsched" / "__init__.py").is_file() and (_CHECKOUT / "components").is_dir():
    # A checkout: its folders are the library (dualsched/__init__.py maps them under dualsched).
    sys.path[0] = str(_CHECKOUT)
else:
    # Installed: dualsched is in this venv's site-packages; this directory on the path would only let its
    # modules (cluster, config_types) shadow a top-level name.
    del sys.path[0]

from dualsched.package.cluster import serve  # noqa: E402

if __name__ == "__main__":
    serve(sys.argv[1:])
