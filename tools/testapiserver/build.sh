#!/usr/bin/env bash
# Builds the test API server (tools/testapiserver) from Debian sid's packaged
# Go libraries, and makes sure etcd is installed. Idempotent and cached: a
# second run with unchanged sources does nothing but print the path.
#
#   tools/testapiserver/build.sh [--force] [--refresh]
#     --force    rebuild the binary even if it looks up to date
#     --refresh  re-resolve and re-fetch the sid packages (sid moves)
#
# Cache: $TESTAPISERVER_CACHE, else $GPUWARDEN_CACHE/testapiserver, else
# <repo>/.cache/testapiserver. The machine's apt sources are never changed:
# sid is read through a private sources list and state directory in the cache.
#
# The last line of the output is the binary's path; everything else goes to
# stderr. Exits non-zero, saying why, when anything fails.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${TESTAPISERVER_CACHE:-${GPUWARDEN_CACHE:+$GPUWARDEN_CACHE/testapiserver}}
cache=${cache:-$repo/.cache/testapiserver}
mirror=${TESTAPISERVER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The Go toolchain package; golang-1.26-go was measured. Falls back to sid's
# default (the golang-go metapackage's) when sid no longer has it.
go_pkg=${TESTAPISERVER_GO_PKG:-golang-1.26-go}

force=0 refresh=0
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    --refresh) refresh=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# The Debian packages whose libraries the server imports; everything they
# depend on is found by following Depends. kube-openapi ships openapi-gen.
roots=(golang-k8s-apiserver-dev golang-k8s-api-dev golang-k8s-apimachinery-dev
       golang-k8s-client-go-dev golang-k8s-component-base-dev golang-k8s-klog-dev
       golang-k8s-kube-openapi-dev kube-openapi)
# openapi-gen's input: every API package whose types the server serves or
# references (see scheme.go), and the apimachinery types they use.
openapi_pkgs=(k8s.io/api/core/v1 k8s.io/api/apps/v1 k8s.io/api/batch/v1
  k8s.io/api/coordination/v1 k8s.io/api/policy/v1 k8s.io/api/autoscaling/v1
  k8s.io/api/admissionregistration/v1
  k8s.io/api/resource/v1 k8s.io/api/resource/v1beta2
  k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime
  k8s.io/apimachinery/pkg/util/intstr k8s.io/apimachinery/pkg/api/resource
  k8s.io/apimachinery/pkg/version)
import_path=gpuwarden.test/testapiserver

log=$cache/build.log
step=starting
say() { echo "testapiserver build: $*" >&2; }
fail() {
  say "FAILED while $step${1:+: $1}"
  if [[ -s $log ]]; then
    say "last lines of $log:"
    tail -n 25 "$log" | sed 's/^/    /' >&2
  fi
  exit 1
}
trap 'fail' ERR
# contents of a file, or nothing if it is missing (without tripping the ERR trap)
contents() { if [[ -f $1 ]]; then cat "$1"; fi; }

mkdir -p "$cache/bin"
# one build at a time per cache (parallel test sessions may all ask for it)
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  say "waiting for another build in $cache"
  flock 9
fi
: >"$log"

# ---- etcd -------------------------------------------------------------------
step="installing etcd-server"
if ! command -v etcd >/dev/null 2>&1 && [[ ! -x /usr/bin/etcd ]]; then
  [[ $(id -u) == 0 ]] || fail "etcd is missing and installing it needs root (apt-get install etcd-server)"
  say "installing etcd-server with apt-get"
  apt-get update >>"$log" 2>&1 9>&-
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server >>"$log" 2>&1 9>&-
  command -v etcd >/dev/null 2>&1 || fail "etcd-server installed but no etcd binary on PATH"
fi

# ---- up to date? -------------------------------------------------------------
binary=$cache/bin/testapiserver
stamp_file=$binary.stamp
sources_hash() {
  (cd "$here" && sha256sum build.sh ./*.go) | sha256sum | cut -d' ' -f1
}
stamp() {
  echo "$(sources_hash) $(contents "$cache/packages.lock" | sha256sum | cut -d' ' -f1)"
}
if (( ! force && ! refresh )) && [[ -x $binary && -f $stamp_file && $(contents "$stamp_file") == "$(stamp)" ]]; then
  say "up to date"
  echo "$binary"
  exit 0
fi

# ---- sid packages -------------------------------------------------------------
root=$cache/root
aptdir=$cache/apt
apt_private() {
  apt-get \
    -o Dir::Etc::SourceList="$aptdir/sources.list" \
    -o Dir::Etc::SourceParts="$aptdir/sources.list.d" \
    -o Dir::Etc::Preferences="$aptdir/preferences" \
    -o Dir::Etc::PreferencesParts="$aptdir/preferences.d" \
    -o Dir::State::Lists="$aptdir/lists" \
    -o Dir::State::status="$aptdir/status" \
    -o Dir::Cache="$aptdir/cache" \
    -o APT::Architecture=amd64 -o APT::Architectures=amd64 \
    -o Debug::NoLocking=1 "$@" 9>&-   # its helper processes may outlive it: keep the lock fd from them
}

request="$mirror $go_pkg ${roots[*]}"
if (( refresh )) || [[ ! -f $cache/packages.lock || ! -d $root ]] ||
   [[ $(contents "$cache/packages.request") != "$request" ]]; then
  step="reading Debian sid's package index ($mirror)"
  mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial" "$aptdir/sources.list.d" "$aptdir/preferences.d" "$cache/debs"
  : >"$aptdir/status"
  echo "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" >"$aptdir/sources.list"
  t0=$SECONDS
  apt_private update >>"$log" 2>&1
  index=$(find "$aptdir/lists" -maxdepth 1 -name '*_dists_sid_main_binary-amd64_Packages*' | head -n1)
  [[ -n $index ]] || fail "no sid Packages index after apt-get update"

  step="resolving the Go dependency closure"
  /usr/lib/apt/apt-helper cat-file "$index" >"$aptdir/Packages"
  python3 - "$aptdir/Packages" "$go_pkg" "${roots[@]}" >"$cache/packages.new" 2>>"$log" <<'PY'
import re, sys

# Reads a Debian Packages index and prints "name version filename" for the
# transitive closure of the roots' Depends, following Go source packages
# (golang-*-dev, golang-*-src) and the Go toolchain, and nothing else:
# their C libraries and tools are not needed to compile.
path, go_pkg, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
pkgs, provides = {}, {}
cur = {}
def flush():
    name = cur.get("Package")
    if name:
        pkgs[name] = dict(cur)
        for p in filter(None, re.split(r"\s*,\s*", cur.get("Provides", ""))):
            provides.setdefault(p.split()[0], []).append(name)
    cur.clear()
with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
        line = line.rstrip("\n")
        if not line:
            flush()
        elif line[0] not in " \t":
            key, _, value = line.partition(":")
            cur[key] = value.strip()
flush()

if go_pkg not in pkgs:
    # sid has moved on: use the toolchain its golang-go points at.
    dep = pkgs.get("golang-go", {}).get("Depends", "")
    m = re.search(r"(golang-1\.\d+-go)\b", dep)
    if not m:
        sys.exit(f"neither {go_pkg} nor a golang-go default toolchain in the index")
    print(f"{go_pkg} is not in sid; using {m.group(1)}", file=sys.stderr)
    go_pkg = m.group(1)

def wanted(name):
    return name.startswith("golang-") and (name.endswith("-dev") or name.endswith("-src") or name == go_pkg)

closure, todo, missing = [], [go_pkg] + roots, []
while todo:
    name = todo.pop(0)
    if name in closure:
        continue
    if name not in pkgs:
        missing.append(name)
        continue
    closure.append(name)
    deps = ",".join(pkgs[name].get(k, "") for k in ("Pre-Depends", "Depends"))
    for alternatives in filter(None, re.split(r"\s*,\s*", deps)):
        chosen = None
        for alt in alternatives.split("|"):
            dep = alt.strip().split()[0].split(":")[0]
            if dep in pkgs:
                chosen = dep
                break
            if dep in provides:
                chosen = sorted(provides[dep])[0]
                break
        if chosen is None:
            if any(wanted(a.strip().split()[0]) for a in alternatives.split("|")):
                missing.append(f"{alternatives} (needed by {name})")
        elif wanted(chosen):
            todo.append(chosen)
if missing:
    sys.exit("not in sid: " + "; ".join(missing))
for name in sorted(closure):
    p = pkgs[name]
    # the file name apt-get download gives it
    file = f'{name}_{p["Version"].replace(":", "%3a")}_{p["Architecture"]}.deb'
    print(name, p["Version"], file)
print(f"go toolchain: {go_pkg}; {len(closure)} packages", file=sys.stderr)
PY
  say "$(wc -l <"$cache/packages.new") packages in the closure"

  step="downloading the sid packages"
  cd "$cache/debs"
  need=()
  while read -r name version file; do
    [[ -s $file ]] || need+=("$name=$version")
  done <"$cache/packages.new"
  if (( ${#need[@]} )); then
    # a few apt-get processes side by side: one alone fetches at a third of the speed
    say "downloading ${#need[@]} packages"
    t1=$SECONDS
    pids=()
    for ((i = 0; i < 4; i++)); do
      part=()
      for ((j = i; j < ${#need[@]}; j += 4)); do part+=("${need[j]}"); done
      (( ${#part[@]} )) || continue
      apt_private download "${part[@]}" >>"$log.dl$i" 2>&1 &
      pids+=($!)
    done
    dl_failed=0
    for pid in "${pids[@]}"; do wait "$pid" || dl_failed=1; done
    cat "$log".dl* >>"$log" 2>/dev/null; rm -f "$log".dl*
    (( ! dl_failed )) || fail "apt-get download failed"
    say "downloaded in $((SECONDS - t1)) s"
  fi
  # drop debs no longer in the closure
  keep=$(cut -d' ' -f3 "$cache/packages.new")
  shopt -s nullglob
  for f in *.deb; do grep -qxF "$f" <<<"$keep" || rm -f "$f"; done
  shopt -u nullglob
  cd "$repo"

  step="unpacking the sid packages"
  t1=$SECONDS
  rm -rf "$root.new"
  mkdir -p "$root.new"
  cut -d' ' -f3 "$cache/packages.new" | sed "s|^|$cache/debs/|" |
    xargs -P "$(nproc)" -n 8 sh -c 'for d; do dpkg-deb -x "$d" "$0" || exit 255; done' "$root.new" >>"$log" 2>&1
  rm -rf "$root" "$cache/gopath/src/$import_path/openapi"
  mv "$root.new" "$root"
  mv "$cache/packages.new" "$cache/packages.lock"
  echo "$request" >"$cache/packages.request"
  say "unpacked in $((SECONDS - t1)) s; packages ready in $((SECONDS - t0)) s"
fi

# ---- Go environment -------------------------------------------------------------
step="setting up the Go toolchain"
go_name=$(awk '$1 ~ /^golang-1\.[0-9]+-go$/ {print $1}' "$cache/packages.lock" | head -n1)
go_version=${go_name#golang-}            # golang-1.26-go -> 1.26-go
goroot=$root/usr/lib/go-${go_version%-go}
[[ -x $goroot/bin/go ]] || fail "no go binary at $goroot/bin/go"
export GOROOT=$goroot PATH=$goroot/bin:$PATH
export GO111MODULE=off GOPATH=$cache/gopath:$root/usr/share/gocode GOPROXY=off GOFLAGS= GOWORK=off GOENV=off
export CGO_ENABLED=0 GOTOOLCHAIN=local GOTELEMETRY=off GOCACHE=$cache/gocache
pkgdir=$cache/gopath/src/$import_path

# ---- OpenAPI definitions ---------------------------------------------------------
step="generating OpenAPI definitions with openapi-gen"
openapi_inputs="${openapi_pkgs[*]} $(sha256sum <"$cache/packages.lock" | cut -d' ' -f1)"
if [[ ! -s $pkgdir/openapi/zz_generated.openapi.go || $(contents "$pkgdir/openapi/.inputs") != "$openapi_inputs" ]]; then
  [[ -x $root/usr/bin/openapi-gen ]] || fail "openapi-gen missing (is golang-k8s-kube-openapi-dev's closure complete?)"
  t0=$SECONDS
  mkdir -p "$pkgdir/openapi"
  : >"$cache/openapi-header.txt"
  "$root/usr/bin/openapi-gen" --go-header-file "$cache/openapi-header.txt" \
    --output-dir "$pkgdir/openapi" --output-pkg "$import_path/openapi" \
    --output-file zz_generated.openapi.go --report-filename /dev/null \
    "${openapi_pkgs[@]}" >>"$log" 2>&1
  [[ -s $pkgdir/openapi/zz_generated.openapi.go ]] || fail "openapi-gen wrote nothing"
  echo "$openapi_inputs" >"$pkgdir/openapi/.inputs"
  say "openapi-gen took $((SECONDS - t0)) s"
fi

# ---- build -------------------------------------------------------------------------
step="compiling (go build)"
rm -f "$pkgdir"/*.go
cp "$here"/*.go "$pkgdir/"
k8s_version=$(awk '$1 == "golang-k8s-apiserver-dev" {print $2}' "$cache/packages.lock")
k8s_version=${k8s_version%%-*}          # 0.36.4-2 -> 0.36.4
k8s_version=${k8s_version#0.}           # -> 36.4
kube_minor=${k8s_version%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v1.$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor"
t0=$SECONDS
say "compiling (a cold build takes a few minutes)"
# The compiler's garbage collector costs a fifth of a cold build here; let each
# compiler process grow to 3 GiB before collecting (peak ~2 GiB in all, measured).
export GOGC=${GOGC:-off} GOMEMLIMIT=${GOMEMLIMIT:-3GiB}
(cd "$pkgdir" && go build -ldflags "$ldflags" -o "$binary.new" .) >>"$log" 2>&1
mv "$binary.new" "$binary"
stamp >"$stamp_file"
say "compiled in $((SECONDS - t0)) s"
trap - ERR
echo "$binary"
