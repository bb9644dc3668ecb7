#!/usr/bin/env bash
# Build the test cluster's binaries from the Go module proxy, once per version:
#
#   hack/build-cluster.sh            build what is missing, print the directory of each component
#   hack/build-cluster.sh --check    exit 1, naming what is missing, instead of building
#
# Components (testing/bertjob_testing/cluster/catalog.py, the one table of them: module, version,
# executables, CRDs; versions in hack/versions.env), each built into <name>-<version>/bin/
# under BERTJOB_TOOLS_DIR (default ~/.cache/bertjob/tools): outside the checkout, so that a fresh
# clone on the same machine (CI's) builds nothing. Go's module and build caches (~/go/pkg/mod,
# ~/.cache/go-build) make a rebuild of another version cheaper too.
#
# Why tools modules: `go install k8s.io/kubernetes/cmd/kube-apiserver@vX` is refused, since
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and
# replaces them with ./staging, and a dependency's replaces do not apply. A module of our own
# requires k8s.io/kubernetes and replaces each staging module with its published v0.X.Y (as
# kubernetes-sigs/scheduler-plugins does). etcd's server module has replaces too, so it gets its
# own small module. Each is written under the component's directory, never in the checkout; go.sum
# is checked against the checksum database (GOSUMDB) as any download is.
#
# A component is built into <dir>.tmp and renamed, so an interrupted build leaves nothing a later
# call would take. A failed build names the component, the version and the last lines of its log.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
[[ "${1:-}" == "--check" ]] && check=true
TOOLS_DIR=${BERTJOB_TOOLS_DIR:-$HOME/.cache/bertjob/tools}
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$TOOLS_DIR"
# One build at a time per machine: a second call (a test run beside make) waits, then finds it built.
exec 9>"$TOOLS_DIR/.lock"
flock 9

# complete DIR BINARY=PACKAGE...: whether DIR was built whole and has every BINARY (a component
# that gained an executable is built again; Go's build cache makes that a matter of its new packages).
complete() {
    local dir=$1 binary
    shift
    [[ -f "$dir/.complete" ]] || return 1
    for binary in "$@"; do
        [[ -x "$dir/bin/${binary%%=*}" ]] || return 1
    done
}

# build COMPONENT VERSION MODULE_REQUIRES REPLACES LDFLAGS BINARY=PACKAGE...
# writes a tools module requiring MODULE_REQUIRES (lines "module version") with REPLACES (lines
# "old => new version"), then builds each PACKAGE into bin/BINARY.
build() {
    local component=$1 version=$2 requires=$3 replaces=$4 ldflags=$5
    shift 5
    local dir="$TOOLS_DIR/$component-$version"
    if complete "$dir" "$@"; then
        echo "$dir"
        return
    fi
    if $check; then
        echo "build-cluster.sh: $component $version is not built (run hack/build-cluster.sh)" >&2
        return 1
    fi
    local work="$dir.tmp" started=$SECONDS
    rm -rf "$work" && mkdir -p "$work/bin" "$work/module"
    {
        echo "module bertjob.dev/tools/$component"
        echo
        echo "go $(go env GOVERSION | sed 's/^go//')"
        echo
        while read -r module module_version; do
            [[ -n "$module" ]] && echo "require $module $module_version"
        done <<<"$requires"
        while read -r old arrow new new_version; do
            [[ -n "$old" ]] && echo "replace $old $arrow $new $new_version"
        done <<<"$replaces"
    } >"$work/module/go.mod"
    echo "package tools" >"$work/module/tools.go"
    local log="$work/build.log"
    echo "build-cluster.sh: building $component $version ($*)" >&2
    if ! (
        cd "$work/module"
        # -mod=mod lets go build add what the packages import at the versions the required modules
        # ask for (go get would upgrade k8s.io/kubernetes itself), writing go.sum from the proxy.
        # One go build for every executable named as its package (the Kubernetes commands share
        # most of their packages, compiled once and linked in parallel); one each for the others.
        local together=() binary
        for binary in "$@"; do
            if [[ "${binary%%=*}" == "${binary##*/}" ]]; then
                together+=("${binary#*=}")
            else
                go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "$work/bin/${binary%%=*}" \
                    "${binary#*=}" || exit 1
            fi
        done
        if ((${#together[@]})); then
            go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "$work/bin/" "${together[@]}" || exit 1
        fi
    ) >"$log" 2>&1; then
        echo "build-cluster.sh: $component $version failed to build; the last lines of $log:" >&2
        tail -n 20 "$log" >&2
        return 1
    fi
    echo "build-cluster.sh: built $component $version in $((SECONDS - started)) s" >&2
    touch "$work/.complete"
    rm -rf "$dir" && mv "$work" "$dir"
    echo "$dir"
}

# staging_replaces KUBERNETES_VERSION STAGING_VERSION: a replace line for each staging module
# that k8s.io/kubernetes at that version replaces with ./staging.
staging_replaces() {
    local go_mod
    go_mod=$(go mod download -json "k8s.io/kubernetes@$1" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$go_mod" |
        while read -r module; do echo "$module => $module $2"; done
}

# version_flags VERSION: what stamps the binaries' /version (unstamped they say v0.0.0).
version_flags() {
    local version=$1 major minor flags=""
    major=${version#v}
    major=${major%%.*}
    minor=${version#v*.}
    minor=${minor%%.*}
    for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $package.gitVersion=$version -X $package.gitMajor=$major"
        flags+=" -X $package.gitMinor=$minor -X $package.gitTreeState=clean"
    done
    echo "$flags"
}

status=0
# The catalog's plan: name, version, module, staging version (k8s.io/kubernetes only), ldflags,
# executables, separated by '|', one component a line.
plan=$(python3 testing/bertjob_testing/cluster/catalog.py plan)
while IFS='|' read -r component version module staging ldflags binaries; do
    replaces="" flags=$ldflags
    read -ra executables <<<"$binaries"
    if [[ -n "$staging" ]]; then
        flags+=$(version_flags "$version")
        if ! $check && ! complete "$TOOLS_DIR/$component-$version" "${executables[@]}"; then
            replaces=$(staging_replaces "$version" "$staging")
        fi
    fi
    build "$component" "$version" "$module $version" "$replaces" "$flags" "${executables[@]}" </dev/null ||
        status=1
done <<<"$plan"
exit $status
