"""Puts the generated stubs (see generate.py) on the import path.

The stubs import each other as `idempost.v1.*`, so their directory itself must be on sys.path.
IDEMPOST_PB_DIR points elsewhere than clients/python/idempost_pb.
"""

import os
import pathlib
import sys

STUBS_DIR = pathlib.Path(
    os.environ.get("IDEMPOST_PB_DIR", pathlib.Path(__file__).resolve().parent / "idempost_pb")
)


def add_to_path() -> None:
    """Makes `import idempost.v1...` find the generated stubs, or explains how to make them."""
    if not (STUBS_DIR / "idempost" / "v1").is_dir():
        generate = pathlib.Path(__file__).resolve().parent / "generate.py"
        raise ImportError(f"no generated stubs in {STUBS_DIR}: run `python {generate}` first")
    if str(STUBS_DIR) not in sys.path:
        sys.path.insert(0, str(STUBS_DIR))
