#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC modules from the .proto files here.
# Needs grpcio-tools (pip install grpcio-tools). PYTHON overrides the
# interpreter; the repo venv is used when present.
#
# Note: the generated code pins runtime minimums (protobuf >= the bundled
# protoc's gencode version, grpcio >= the grpcio-tools version). Keep
# pyproject's pins in step after regenerating with a newer grpcio-tools.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

cd "$here"
protos=(deviceplugin_v1beta1.proto podresources_v1.proto dra_v1.proto dra_v1beta1.proto pluginregistration_v1.proto)
"$PYTHON" -m grpc_tools.protoc -I. \
  --python_out=. --pyi_out=. --grpc_python_out=. "${protos[@]}"

# protoc writes `import X_pb2 as ...`, which only works with this directory
# on sys.path; make it package-relative so `gpuwarden.grpcapi` is importable.
for p in "${protos[@]}"; do
  base="${p%.proto}"
  sed -i -E "s/^import (${base}_pb2) as /from . import \1 as /" "${base}_pb2_grpc.py"
done

# Report the runtime minimums the fresh code asserts at import time.
"$PYTHON" - >&2 <<'PY'
import pathlib, re
pb = pathlib.Path("deviceplugin_v1beta1_pb2.py").read_text()
gr = pathlib.Path("deviceplugin_v1beta1_pb2_grpc.py").read_text()
pv = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)", pb)
gv = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", gr)
print("generated code needs protobuf>=%s grpcio>=%s"
      % (".".join(pv.groups()) if pv else "?", gv.group(1) if gv else "?"))
PY
