#!/usr/bin/env bash
# Fetches the real node runtime for the CRI tests and the GPU scenario: Debian sid's containerd
# (2.1), runc (1.3) and busybox-static, unpacked into a cache (nothing installed, the machine's apt
# sources untouched: sid is read through a private sources list, as tools/testapiserver/build.sh
# does), and builds the two images they run from busybox alone (tools/cri/images.py; no registry).
#
#   tools/cri/build.sh [--refresh]      --refresh: re-read sid's index and fetch again
#
# Cache: $CRI_CACHE, else $GPUWARDEN_CACHE/cri, else <repo>/.cache/cri. $CRI_DEBS: a directory holding
# the .debs (containerd, runc, busybox-static; libc6, libseccomp2, patchelf where needed): nothing is
# fetched (a host with no network, such as the GPU machine). Where this host's glibc is
# older than the one sid's runc was linked against (Debian 12: 2.36 < 2.38), sid's libc6 and
# libseccomp2 are unpacked beside it and a copy of runc gets their loader and library path
# (patchelf, itself fetched with `apt-get download`): runc re-executes /proc/self/exe, so a
# wrapper script around the loader cannot work. The last line of the output is the cache's bin
# directory (containerd, containerd-shim-runc-v2, ctr, runc) whose images.tar holds the images;
# everything else goes to stderr. Exits non-zero, saying why.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${CRI_CACHE:-${GPUWARDEN_CACHE:+$GPUWARDEN_CACHE/cri}}
cache=${cache:-$repo/.cache/cri}
mirror=${CRI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=(containerd runc busybox-static)
refresh=0
for arg in "$@"; do
  case $arg in
    --refresh) refresh=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

log=$cache/build.log
step=starting
say() { echo "cri build: $*" >&2; }
fail() {
  say "FAILED while $step${1:+: $1}"
  [[ -s $log ]] && tail -n 15 "$log" | sed 's/^/    /' >&2
  exit 1
}
trap 'fail' ERR
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
: >"$log"
bin=$cache/bin
stamp_of() { (cd "$here" && sha256sum build.sh images.py) | sha256sum | cut -d' ' -f1; }
if (( ! refresh )) && [[ -f $bin/.stamp && $(cat "$bin/.stamp") == "$(stamp_of)" ]]; then
  say "up to date"
  echo "$bin"
  exit 0
fi

aptdir=$cache/apt
apt_private() {
  apt-get -o Dir::Etc::SourceList="$aptdir/sources.list" -o Dir::Etc::SourceParts="$aptdir/sources.list.d" \
    -o Dir::Etc::Preferences="$aptdir/preferences" -o Dir::Etc::PreferencesParts="$aptdir/preferences.d" \
    -o Dir::State::Lists="$aptdir/lists" -o Dir::State::status="$aptdir/status" -o Dir::Cache="$aptdir/cache" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o Debug::NoLocking=1 "$@" 9>&-
}
# fetch NAME...: sid's packages into $cache/debs, or from $CRI_DEBS (a host with no network: carried .debs)
fetch() {
  if [[ -n ${CRI_DEBS:-} ]]; then
    for p in "$@"; do cp "$CRI_DEBS/${p}"_*.deb "$cache/debs/"; done
  else
    (cd "$cache/debs" && apt_private download "$@" >>"$log" 2>&1)
  fi
}
rm -rf "$cache/debs" "$cache/root" "$bin"
mkdir -p "$cache/debs" "$cache/root" "$bin"
if [[ -z ${CRI_DEBS:-} ]]; then
  step="reading Debian sid's package index ($mirror)"
  mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial" "$aptdir/sources.list.d" "$aptdir/preferences.d"
  : >"$aptdir/status"
  echo "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" >"$aptdir/sources.list"
  apt_private update >>"$log" 2>&1
fi
step="fetching ${pkgs[*]} (sid)"
fetch "${pkgs[@]}"
for d in "$cache"/debs/*.deb; do dpkg-deb -x "$d" "$cache/root"; done
cp "$cache/root/usr/bin/containerd" "$cache/root/usr/bin/containerd-shim-runc-v2" "$cache/root/usr/bin/ctr" \
   "$cache/root/usr/sbin/runc" "$bin/"

step="checking that runc runs here"
if ! "$bin/runc" --version >>"$log" 2>&1; then
  say "sid's runc does not run on this host's libc ($(ldd --version | head -n1)); giving it sid's libc6"
  step="fetching sid's libc6 and libseccomp2, and patchelf"
  fetch libc6 libseccomp2
  libs=$cache/sidlibc
  rm -rf "$libs" && mkdir -p "$libs"
  for d in "$cache"/debs/libc6_*.deb "$cache"/debs/libseccomp2_*.deb; do dpkg-deb -x "$d" "$libs"; done
  pe=$(command -v patchelf || true)
  if [[ -z $pe ]]; then
    # this machine's own suite: patchelf linked against this machine's libc
    if [[ -n ${CRI_DEBS:-} ]]; then cp "$CRI_DEBS"/patchelf_*.deb "$cache/debs/"
    else (cd "$cache/debs" && apt-get download patchelf >>"$log" 2>&1 9>&-); fi
    dpkg-deb -x "$cache"/debs/patchelf_*.deb "$cache/patchelf"
    pe=$cache/patchelf/usr/bin/patchelf
  fi
  L=$libs/usr/lib/x86_64-linux-gnu
  step="patching runc's loader and library path"
  "$pe" --set-interpreter "$L/ld-linux-x86-64.so.2" --set-rpath "$L" "$bin/runc" >>"$log" 2>&1
  "$bin/runc" --version >>"$log" 2>&1
fi
for t in containerd ctr; do "$bin/$t" --version >>"$log" 2>&1; done

step="building the images (tools/cri/images.py)"
python3 "$here/images.py" "$cache/root/usr/bin/busybox" "$bin/images.tar" >>"$log" 2>&1
step="recording the versions"
{
  "$bin/containerd" --version
  "$bin/runc" --version | sed -n 1p
  (cd "$cache/debs" && ls ./*.deb)
} >"$bin/VERSIONS"
rm -rf "$cache/root"   # what is needed was copied into bin/ (and the images)
stamp_of >"$bin/.stamp"
trap - ERR
say "ready: $(head -n2 "$bin/VERSIONS" | tr '\n' ';')"
echo "$bin"
