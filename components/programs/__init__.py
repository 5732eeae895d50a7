"""Programs dualsched runs inside its pods, shipped as ConfigMap files (standard library only).

They are modules here so the tests import and run them directly; :func:`source` gives the text a
ConfigMap carries.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def source(file_name: str) -> str:
    return (_HERE / file_name).read_text()
