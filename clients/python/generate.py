#!/usr/bin/env python3
"""Generates the Python stubs for every .proto under proto/ with grpcio-tools.

Usage: python generate.py [--proto-root DIR] [--out DIR]

The stubs land in clients/python/idempost_pb/ by default (gitignored): one package per proto
package (idempost/v1/*_pb2.py, *_pb2_grpc.py and .pyi type hints). The output is replaced whole, so
a removed .proto leaves nothing behind.
"""

import argparse
import pathlib
import shutil
import sys
from importlib import resources

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-root", type=pathlib.Path, default=HERE.parent.parent / "proto")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "idempost_pb")
    args = parser.parse_args()

    root = args.proto_root.resolve()
    protos = sorted(str(path) for path in root.rglob("*.proto"))
    if not protos:
        print(f"no .proto files under {root}", file=sys.stderr)
        return 1
    out = args.out.resolve()
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # grpcio-tools ships the well-known types (google/protobuf/timestamp.proto, ...).
    well_known = resources.files("grpc_tools") / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={root}",
            f"--proto_path={well_known}",
            f"--python_out={staging}",
            f"--pyi_out={staging}",
            f"--grpc_python_out={staging}",
            *protos,
        ]
    )
    if status != 0:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"protoc failed with status {status}", file=sys.stderr)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    print(f"generated stubs for {len(protos)} files in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
