#!/usr/bin/env bash
# Build the test cluster's binaries from the Go module proxy, once per version:
#
#   hack/build-cluster.sh            build what is missing, print the directory of each component
#   hack/build-cluster.sh --check    exit 1, naming what is missing, instead of building
#
# Components and what each gives (versions: hack/versions.env):
#   etcd-<ETCD_VERSION>/bin/etcd
#   kubernetes-<KUBERNETES_VERSION>/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   kube-apiserver-<KUBERNETES_FLOOR_VERSION>/bin/kube-apiserver    the oldest version the chart claims
#   kwok-<KWOK_VERSION>/bin/kwok
#   training-operator-<TRAINING_OPERATOR_VERSION>/bin/training-operator   (Kubeflow v1: PyTorchJob)
#   mpi-operator-<MPI_OPERATOR_VERSION>/bin/mpi-operator                  (MPIJob v2beta1)
#   trainer-<TRAINER_VERSION>/bin/trainer-controller-manager              (Kubeflow Trainer v2: TrainJob)
#   jobset-<JOBSET_VERSION>/bin/jobset                                    (JobSet, which TrainJob makes)
#   kueue-<KUEUE_VERSION>/bin/kueue
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
# shellcheck source=versions.env
source hack/versions.env

check=false
[[ "${1:-}" == "--check" ]] && check=true
TOOLS_DIR=${BERTJOB_TOOLS_DIR:-$HOME/.cache/bertjob/tools}
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$TOOLS_DIR"
# One build at a time per machine: a second call (a test run beside make) waits, then finds it built.
exec 9>"$TOOLS_DIR/.lock"
flock 9

# build COMPONENT VERSION MODULE_REQUIRES REPLACES LDFLAGS BINARY=PACKAGE...
# writes a tools module requiring MODULE_REQUIRES (lines "module version") with REPLACES (lines
# "old => new version"), then builds each PACKAGE into bin/BINARY.
build() {
    local component=$1 version=$2 requires=$3 replaces=$4 ldflags=$5
    shift 5
    local dir="$TOOLS_DIR/$component-$version"
    if [[ -f "$dir/.complete" ]]; then
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
        for binary in "$@"; do
            go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "$work/bin/${binary%%=*}" \
                "${binary#*=}" || exit 1
        done
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

# kubernetes COMPONENT VERSION STAGING_VERSION BINARY...: the k8s.io/kubernetes commands BINARY...
kubernetes() {
    local component=$1 version=$2 staging=$3 replaces=""
    shift 3
    if ! $check && [[ ! -f "$TOOLS_DIR/$component-$version/.complete" ]]; then
        replaces=$(staging_replaces "$version" "$staging")
    fi
    local binaries=()
    for binary in "$@"; do binaries+=("$binary=k8s.io/kubernetes/cmd/$binary"); done
    build "$component" "$version" "k8s.io/kubernetes $version" "$replaces" "$(version_flags "$version")" \
        "${binaries[@]}"
}

status=0
build etcd "$ETCD_VERSION" "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "" \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=module" etcd=go.etcd.io/etcd/server/v3 || status=1

kubernetes kubernetes "$KUBERNETES_VERSION" "$KUBERNETES_STAGING_VERSION" \
    kube-apiserver kube-controller-manager kube-scheduler kubectl || status=1
build kwok "$KWOK_VERSION" "sigs.k8s.io/kwok $KWOK_VERSION" "" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" kwok=sigs.k8s.io/kwok/cmd/kwok || status=1
# The oldest Kubernetes the chart claims: its API server alone, to install the CRD and the chart on.
kubernetes kube-apiserver "$KUBERNETES_FLOOR_VERSION" "$KUBERNETES_FLOOR_STAGING_VERSION" kube-apiserver || status=1

# The controllers, each from its own tools module: their go.mod files pin different k8s.io/* and
# controller-runtime versions, and one module would force one set on all of them.
controller() {
    local component=$1 version=$2 module=$3 binary=$4
    build "$component" "$version" "$module $version" "" "" "$binary" || status=1
}
controller training-operator "$TRAINING_OPERATOR_VERSION" github.com/kubeflow/training-operator \
    training-operator=github.com/kubeflow/training-operator/cmd/training-operator.v1
controller mpi-operator "$MPI_OPERATOR_VERSION" github.com/kubeflow/mpi-operator \
    mpi-operator=github.com/kubeflow/mpi-operator/cmd/mpi-operator
controller trainer "$TRAINER_VERSION" github.com/kubeflow/trainer/v2 \
    trainer-controller-manager=github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
controller jobset "$JOBSET_VERSION" sigs.k8s.io/jobset jobset=sigs.k8s.io/jobset
controller kueue "$KUEUE_VERSION" sigs.k8s.io/kueue kueue=sigs.k8s.io/kueue/cmd/kueue
exit $status
