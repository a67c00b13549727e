#!/usr/bin/env bash
# Generate the Python gRPC stubs for proto/cascade/**/*.proto into cascade_proto/ (gitignored;
# only its __init__.py is committed). proto/cascade/v1/x.proto becomes cascade_proto.v1.x_pb2
# (+ _pb2_grpc, .pyi): the virtual include root keeps the stubs out of the `cascade` package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"

find cascade_proto -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
mapfile -t protos < <(cd proto/cascade && find . -name '*.proto' | sed 's|^\./|cascade_proto/|' | sort)
"$PY" -m grpc_tools.protoc -Icascade_proto=proto/cascade \
    --python_out=. --grpc_python_out=. --pyi_out=. "${protos[@]}"
find cascade_proto -mindepth 1 -type d -exec sh -c 'touch "$1/__init__.py"' _ {} \;
echo "generated ${#protos[@]} proto file(s) into cascade_proto/"
