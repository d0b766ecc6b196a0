#!/usr/bin/env bash
# Regenerate the CRI stubs here from cri_v1.proto (tools/cri/trim_proto.py made it from
# k8s.io/cri-api's api.proto), as src/gpuwarden/grpcapi/regen.sh does for the product's protos.
# Needs grpcio-tools. Test infrastructure only: gpuwarden itself never speaks CRI.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
cd "$here"
# messages only: tests/support/cri.py makes the calls on the channel itself (no grpcio pin)
"$PYTHON" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. cri_v1.proto
