#!/bin/bash
# Makes what the run-20 GPU call carries, in the repository root it is run from (the checkout the device tool
# sends): .whl/ (gpuwarden's dependencies and the Kubernetes client's, cp312 manylinux wheels, pinned to the
# versions of the development venv), .api/ (the test API server and etcd, xz-compressed, with SHA256SUMS of the
# binaries) and .plugin/ (the device plugin's .xz and its SHA256SUMS line, for the plugin scenarios; run 20 does
# not start it). Each folder is listed in .git/info/exclude so it travels only when `carry` names it.
#   bash docs/validation/2026-12-02-run20-carry.sh        # ~46 MB in all: .whl 21, .api 19, .plugin 5.2
# Needs pip with network access, xz, the built test API server (tools/testapiserver/build.sh) and etcd.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
for d in .whl .api .plugin; do grep -qx "/$d/" "$(git rev-parse --git-common-dir)/info/exclude" || echo "/$d/" >> "$(git rev-parse --git-common-dir)/info/exclude"; done

mkdir -p .whl
p=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
   --platform manylinux1_x86_64 -d .whl)
python3 -m pip download -q "${p[@]}" msgspec==0.23.0 kubernetes==37.0.2 grpcio==1.85.3 protobuf==7.36.2 click==8.5.1 \
  prometheus_client==0.26.0 PyYAML==6.0.4 certifi==2026.10.19.post1 python-dateutil==4.0.0 tzdata==2026.6 \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
  websocket-client==1.9.2 requests==2.34.2 requests-oauthlib==2.0.0 oauthlib==4.0.1 urllib3==2.8.0 durationpy==0.11 \
  idna==3.20 charset-normalizer==3.5.3
# (kubernetes 37 lists aiohttp for its asyncio client only; gpuwarden does not import it, and the GPU image has it)

tas=${GPUWARDEN_TESTAPISERVER:-$root/.cache/testapiserver/bin/testapiserver}
etcd=$(command -v etcd)
mkdir -p .api
xz -T2 -6 -c "$tas" > .api/testapiserver.xz
xz -T2 -6 -c "$etcd" > .api/etcd.xz
{ (cd "$(dirname "$tas")" && sha256sum testapiserver); (cd "$(dirname "$etcd")" && sha256sum etcd); } > .api/SHA256SUMS

plugin=${PLUGIN_KIT:-$root/../shared/tools/nvidia-device-plugin}
mkdir -p .plugin
cp "$plugin"/nvidia-device-plugin-v*-linux-amd64.xz .plugin/
grep " nvidia-device-plugin$" "$plugin/SHA256SUMS" > .plugin/SHA256SUMS
chmod -R u+w .plugin
du -sh .whl .api .plugin
