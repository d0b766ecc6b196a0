#!/usr/bin/env bash
# Builds the gpuwarden OCI image from ./Dockerfile without a Docker engine or a registry:
#   1. the base, debian:bookworm-slim, made from Debian's packages with mmdebstrap (minbase, docs
#      and locales left out, as the official slim image does), cached for a week;
#   2. `buildah bud` of ./Dockerfile (chroot isolation, vfs storage, layer cache), --pull=never;
#   3. the result written as an OCI image layout (oci:<dir>:<tag>), for umoci and runc/crun.
#
#   tools/image/build.sh [--refresh-base]
#
# Cache: $IMAGE_CACHE, else $GPUWARDEN_CACHE/image, else <repo>/.cache/image.
# Needs root (chroot, mknod in the base). Installs buildah, umoci, runc, crun and mmdebstrap
# with apt-get when they are missing. The last line of the output is the OCI layout's
# reference (oci:DIR:TAG); everything else goes to stderr. Exits non-zero, saying why.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${IMAGE_CACHE:-${GPUWARDEN_CACHE:+$GPUWARDEN_CACHE/image}}
cache=${cache:-$repo/.cache/image}
suite=bookworm
base_ref=docker.io/library/debian:bookworm-slim
tag=localhost/gpuwarden:test
refresh=0
for arg in "$@"; do
  case $arg in
    --refresh-base) refresh=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

say() { echo "image build: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
[[ $(id -u) == 0 ]] || die "needs root (buildah's chroot isolation, mmdebstrap's device nodes)"
mkdir -p "$cache"
log=$cache/build.log
: >"$log"

tools=(buildah umoci runc crun mmdebstrap)
missing=()
for t in "${tools[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
if ((${#missing[@]})); then
  say "installing ${missing[*]} with apt-get"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    >>"$log" 2>&1 || die "apt-get install ${missing[*]} (see $log)"
fi

B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
base_tar=$cache/$suite-slim.tar
if ((refresh)) || [[ ! -s $base_tar ]] || [[ -n $(find "$base_tar" -mtime +7) ]]; then
  say "making $base_ref from Debian packages (mmdebstrap --variant=minbase $suite)"
  mmdebstrap --variant=minbase --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    "$suite" "$base_tar.part" >>"$log" 2>&1 || die "mmdebstrap $suite (see $log)"
  mv "$base_tar.part" "$base_tar"
  "${B[@]}" rmi -f "$base_ref" >>"$log" 2>&1 || true
fi
if ! "${B[@]}" inspect --type image "$base_ref" >/dev/null 2>&1; then
  say "importing the base as $base_ref"
  c=$("${B[@]}" from scratch)
  { "${B[@]}" add "$c" "$base_tar" / && "${B[@]}" config --cmd '["bash"]' --os linux --arch amd64 "$c" \
      && "${B[@]}" commit -q --rm "$c" "$base_ref"; } >>"$log" 2>&1 || die "importing the base (see $log)"
fi

# the host's CA bundle reaches pip as a build secret (a TLS-intercepting proxy; never in a layer)
secret=()
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
[[ -s $ca ]] && secret=(--secret "id=cacert,src=$ca")
say "buildah bud $repo/Dockerfile"
"${B[@]}" bud --isolation chroot --pull=never --layers "${secret[@]}" -t "$tag" -f "$repo/Dockerfile" "$repo" >>"$log" 2>&1 \
  || die "buildah bud (see $log)"
rm -rf "$cache/oci"
"${B[@]}" push -q "$tag" "oci:$cache/oci:test" >>"$log" 2>&1 || die "writing the OCI layout (see $log)"
# keep the storage from growing run after run: dangling images of earlier builds go
"${B[@]}" rm --all >>"$log" 2>&1 || true
"${B[@]}" rmi --prune >>"$log" 2>&1 || true
echo "oci:$cache/oci:test"
