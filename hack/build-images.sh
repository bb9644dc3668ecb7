#!/usr/bin/env bash
# Build bertjob's images: the operator, and the trainer for each accelerator.
#
#   hack/build-images.sh [--builder docker|buildah|print] [--local] [--horovod-wheels DIR] [TARGET...]
#   hack/build-images.sh --builder docker|print --oci-dir DIR [--platform LIST] [TARGET...]
#   hack/build-images.sh --buildah-flags      # buildah's storage flags, one a line (for scripts)
#   hack/build-images.sh --cache-dir          # $BERTJOB_CACHE: where the builds keep what they reuse
#   hack/build-images.sh --tags [TARGET...]   # each TARGET's tag, one a line; builds nothing
#
# TARGET: operator, cuda, xeon, gaudi (default: all four). Tags: ghcr.io/bertjob/operator:VERSION
# and ghcr.io/bertjob/trainer:VERSION-TARGET, VERSION the chart's appVersion
# (charts/bertjob/Chart.yaml), so that the chart's and the kustomize tree's default images are
# these (tests/test_image_tags.py); $REGISTRY replaces ghcr.io/bertjob.
#
# --builder: docker (BuildKit) when `docker info` answers, else buildah when it is installed, else
#   print, which prints the docker commands and builds nothing.
# --local: for a machine that reaches no image registry, as the tests' (buildah only; operator and
#   xeon): the base is Debian bookworm made here with mmdebstrap (kept in $BERTJOB_CACHE/images),
#   the kubectl image a stand-in carrying this machine's kubectl at /bin/kubectl, as Kubernetes'
#   own kubectl image does, and pip in the build trusts this machine's CA bundle ($PIP_CERT or
#   $SSL_CERT_FILE) and reads its find-links directories ($PIP_FIND_LINKS or pip's config); those
#   files are mounted read-only at their own paths. xeon's torch: PyTorch's CPU index cannot be
#   reached, so the image gets PyPI's torch (the CUDA build, which runs on the CPU), from a local
#   index in $BERTJOB_CACHE/torch-index that the first --local build fills from PyPI (about 3 GB,
#   once; pip's own cache keeps nothing here) and mounts read-only. Horovod's wheel comes from
#   $BERTJOB_CACHE/wheels when build_horovod.sh left one there (see --horovod-wheels).
# --oci-dir DIR: build with `docker buildx build` into DIR/TARGET.tar, an OCI archive (the image
#   index, with BuildKit's SBOM and provenance attestations), pushing nothing: the release
#   workflow pushes the archives once every image has built. --platform LIST (comma-separated,
#   default linux/amd64) builds each of them into the index; the trainer images are linux/amd64
#   only (the Gaudi stack and Intel's Xeon build target x86-64, and the CUDA image's Horovod would
#   compile for hours under emulation; docs/images.md), so a trainer target with another is refused.
# --horovod-wheels DIR: a directory that trainer_image/build_horovod.sh filled for the image's
#   torch and Python; the xeon (or cuda) image installs its wheel instead of compiling Horovod
#   (about 6 minutes on 2 cores). The image build fails if DIR has no wheel for it.
#
# buildah keeps its images in $BERTJOB_CACHE/containers (BERTJOB_CACHE's default:
# ~/.cache/bertjob/build), with the overlay driver where it works, else vfs ($BUILDAH_DRIVER chooses), and
# --layers, so that a second build reuses every unchanged layer. To push one:
#   buildah $(hack/build-images.sh --buildah-flags | tr '\n' ' ') push IMAGE docker://IMAGE
# To start over, delete $BERTJOB_CACHE/containers.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# Kept in the home directory by default, so that a fresh clone on the same machine (CI's) reuses
# the base, the torch index, Horovod's wheel and every unchanged image layer.
CACHE=${BERTJOB_CACHE:-$HOME/.cache/bertjob/build}
REGISTRY=${REGISTRY:-ghcr.io/bertjob}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$REPO/charts/bertjob/Chart.yaml")
if [[ -z "$VERSION" ]]; then
    echo "build-images.sh: no appVersion in $REPO/charts/bertjob/Chart.yaml" >&2
    exit 2
fi
LOCAL_BASE=localhost/bertjob-base:bookworm
LOCAL_KUBECTL=localhost/bertjob-kubectl:local
TORCH_INDEX=""  # local_torch_index sets it

# overlay where this machine can mount it (root, a kernel with overlayfs, a cache directory that is
# not itself on overlayfs), else vfs. vfs works everywhere but copies the whole root filesystem
# for every instruction of a Dockerfile, cached or not: on the tests' machine the operator image
# took 156 s cold and 83 s fully cached with vfs, 45 s and under 10 s with overlay.
overlay_works() {
    local probe status=1
    [[ $EUID -eq 0 ]] || return 1
    mkdir -p "$CACHE/containers"
    probe=$(mktemp -d "$CACHE/containers/.overlay-probe.XXXXXX")
    mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        umount "$probe/merged" && status=0
    fi
    rm -rf "$probe"
    return $status
}
# buildah's global flags for the storage in $CACHE/containers (sets BUILDAH_FLAGS).
storage_flags() {
    if [[ -z "${BUILDAH_DRIVER:-}" ]]; then
        if overlay_works; then BUILDAH_DRIVER=overlay; else BUILDAH_DRIVER=vfs; fi
    fi
    # One storage directory per driver: containers/storage refuses to open one made by another.
    BUILDAH_FLAGS=(--root "$CACHE/containers/$BUILDAH_DRIVER" --runroot "$CACHE/containers/$BUILDAH_DRIVER-run"
        --storage-driver "$BUILDAH_DRIVER")
    # Without this, the overlay driver leaves its directory bind-mounted after buildah exits, and
    # deleting $CACHE fails with "Device or resource busy".
    if [[ "$BUILDAH_DRIVER" == overlay ]]; then
        BUILDAH_FLAGS+=(--storage-opt overlay.skip_mount_home=true)
    fi
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

builder=""
oci_dir=""
platforms=linux/amd64
local_mode=false
tags_only=false
wheels=""
targets=()
while (($#)); do
    case "$1" in
        --builder) builder=${2:?--builder needs docker, buildah or print}; shift 2 ;;
        --local) local_mode=true; shift ;;
        --oci-dir) oci_dir=${2:?--oci-dir needs a directory}; shift 2 ;;
        --platform) platforms=${2:?--platform needs a comma-separated list}; shift 2 ;;
        --horovod-wheels) wheels=$(cd "${2:?--horovod-wheels needs a directory}" && pwd); shift 2 ;;
        --buildah-flags) storage_flags; printf '%s\n' "${BUILDAH_FLAGS[@]}"; exit 0 ;;
        --cache-dir) echo "$CACHE"; exit 0 ;;
        --tags) tags_only=true; shift ;;
        -h | --help) usage ;;
        operator | cuda | xeon | gaudi) targets+=("$1"); shift ;;
        *) echo "build-images.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
((${#targets[@]})) || targets=(operator cuda xeon gaudi)

tag() {
    if [[ "$1" == operator ]]; then echo "$REGISTRY/operator:$VERSION"; else echo "$REGISTRY/trainer:$VERSION-$1"; fi
}

if $tags_only; then
    for target in "${targets[@]}"; do tag "$target"; done
    exit 0
fi

if [[ -z "$builder" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        builder=docker
    elif command -v buildah >/dev/null; then
        builder=buildah
    else
        builder=print
    fi
fi
case "$builder" in docker | buildah | print) ;; *) echo "build-images.sh: unknown builder $builder" >&2; exit 2 ;; esac
if $local_mode && [[ "$builder" != buildah ]]; then
    echo "build-images.sh: --local builds with buildah only (found builder: $builder)" >&2
    exit 2
fi
if [[ -n "$oci_dir" && "$builder" == buildah ]]; then
    echo "build-images.sh: --oci-dir builds with docker buildx only (found builder: $builder)" >&2
    exit 2
fi
if [[ -z "$oci_dir" && "$platforms" != linux/amd64 ]]; then
    echo "build-images.sh: --platform needs --oci-dir (a multi-platform index is written as an OCI archive)" >&2
    exit 2
fi
for target in "${targets[@]}"; do
    if [[ "$target" != operator && "$platforms" != linux/amd64 ]]; then
        echo "build-images.sh: the trainer image $target is built for linux/amd64 only, not $platforms" >&2
        exit 2
    fi
done
if $local_mode; then
    for target in "${targets[@]}"; do
        if [[ "$target" == cuda || "$target" == gaudi ]]; then
            echo "build-images.sh: --local builds operator and xeon; $target needs its registry's base image" >&2
            exit 2
        fi
    done
    if [[ -z "$wheels" && -n "$(find "$CACHE/wheels" -path '*/horovod-*/horovod-*.whl' 2>/dev/null | head -n 1)" ]]; then
        wheels="$CACHE/wheels"
    fi
fi

buildah_() {
    buildah "${BUILDAH_FLAGS[@]}" "$@"
}

# An image's layers (their diff IDs), space-separated.
diff_ids() {
    buildah_ inspect --type image --format '{{range .OCIv1.RootFS.DiffIDs}}{{.}} {{end}}' "$1"
}

# After a build that moved a tag from image $1 to $2: the untagged images that hold a layer of $1
# which no tagged image holds are removed. buildah --layers keeps each step's image as the next
# build's cache, and nothing removed the replaced ones: with the xeon image's 6 GB torch layer,
# every change to pyproject.toml left another 6 GB in the storage. The cache of every tagged image
# stays, and so does that of a stage built apart from the image (Horovod's) unless it was built on
# a replaced layer.
prune_replaced() {
    local old=$1 new=$2 id name layer
    local -A tagged=() stale=()
    local untagged=() remove=()
    [[ -n "$old" && "$old" != "$new" ]] || return 0
    while read -r id name; do
        if [[ "$name" == "<none>:<none>" ]]; then
            untagged+=("$id")
        else
            for layer in $(diff_ids "$id"); do tagged[$layer]=1; done
        fi
    done < <(buildah_ images --all --noheading --no-trunc --format '{{.ID}} {{.Name}}:{{.Tag}}')
    for layer in $(diff_ids "$old"); do
        [[ -n "${tagged[$layer]:-}" ]] || stale[$layer]=1
    done
    ((${#stale[@]})) || return 0
    for id in "${untagged[@]}"; do
        for layer in $(diff_ids "$id"); do
            if [[ -n "${stale[$layer]:-}" ]]; then
                remove+=("$id")
                break
            fi
        done
    done
    ((${#remove[@]})) || return 0
    # A container still made from one (a test's) keeps it; the next build tries again.
    old=${old#sha256:}
    if buildah_ rmi "${remove[@]}" >/dev/null; then
        echo "build-images.sh: removed ${#remove[@]} images that only the replaced image ${old:0:12} used"
    else
        echo "build-images.sh: WARNING: could not remove every image that only ${old:0:12} used" >&2
    fi
}

# The Debian bookworm base, made from the Debian archive and kept as a tarball, then imported once.
local_base() {
    local tarball="$CACHE/images/debian-bookworm.tar"
    if [[ ! -f "$tarball" ]]; then
        mkdir -p "$CACHE/images"
        echo "build-images.sh: making $tarball with mmdebstrap (about a minute)"
        # mmdebstrap picks its output format from the name's extension: keep .tar while it is partial.
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$CACHE/images/debian-bookworm.partial.tar"
        mv "$CACHE/images/debian-bookworm.partial.tar" "$tarball"
    fi
    if ! buildah_ inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
        local container
        container=$(buildah_ from scratch)
        buildah_ add --quiet "$container" "$tarball" /
        # A tarball carries no image configuration: give it the PATH that Debian's images have.
        buildah_ config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --cmd /bin/bash "$container"
        buildah_ commit --quiet --rm "$container" "$LOCAL_BASE" >/dev/null
    fi
}

# Kubernetes' kubectl image (registry.k8s.io/kubectl) is Debian with the binary at /bin/kubectl;
# the stand-in is the local base with this machine's kubectl there, labelled with its digest so
# that another kubectl replaces it.
local_kubectl() {
    local binary digest container
    binary=$(readlink -f "${KUBECTL:-$(command -v kubectl || true)}")
    if [[ ! -x "$binary" ]]; then
        echo "build-images.sh: --local needs kubectl on PATH (or \$KUBECTL) for the operator image" >&2
        exit 1
    fi
    digest=$(sha256sum "$binary" | cut -d' ' -f1)
    if [[ "$(buildah_ inspect --type image --format '{{index .OCIv1.Config.Labels "bertjob.kubectl.sha256"}}' \
        "$LOCAL_KUBECTL" 2>/dev/null || true)" != "$digest" ]]; then
        container=$(buildah_ from "$LOCAL_BASE")
        buildah_ copy --quiet --chmod 0755 "$container" "$binary" /bin/kubectl
        buildah_ config --label "bertjob.kubectl.sha256=$digest" "$container"
        buildah_ commit --quiet --rm "$container" "$LOCAL_KUBECTL" >/dev/null
    fi
}

# xeon's torch for --local: the files of requirements/torch.lock (torch as PyPI builds it, the CUDA
# build, and its CUDA libraries), downloaded from pip's index with their hashes checked, for the
# local base's Python 3.11, into $CACHE/torch-index/torch-LOCKHASH-cp311/files, and a PEP 503 page
# per project under simple/, so that the Dockerfile's own step (pip install --require-hashes
# --index-url "$TORCH_INDEX_URL" -r requirements/torch.lock) installs from it with no download.
# Sets TORCH_INDEX. A download that stops half-way leaves no index behind.
local_torch_index() {
    local lock=$REPO/requirements/torch.lock partial
    if [[ ! -f "$lock" ]]; then
        echo "build-images.sh: no $lock; run make lock" >&2
        exit 1
    fi
    TORCH_INDEX="$CACHE/torch-index/torch-$(sha256sum "$lock" | cut -c1-12)-cp311"
    [[ -f "$TORCH_INDEX/simple/torch/index.html" ]] && return 0
    echo "build-images.sh: downloading requirements/torch.lock's files from pip's index into $TORCH_INDEX (about 3 GB, once)"
    partial="$TORCH_INDEX.partial"
    rm -rf "$partial"
    mkdir -p "$partial/files"
    python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: --python-version 3.11 \
        --dest "$partial/files" -r "$lock"
    python3 - "$partial" <<'EOF'
import html
import os
import re
import sys

root = sys.argv[1]
projects: dict[str, list[str]] = {}
for name in sorted(os.listdir(os.path.join(root, "files"))):
    # A wheel's name starts with its distribution's, whose PEP 503 form names the page.
    projects.setdefault(re.sub(r"[-_.]+", "-", name.split("-")[0]).lower(), []).append(name)
for project, names in projects.items():
    os.makedirs(os.path.join(root, "simple", project))
    with open(os.path.join(root, "simple", project, "index.html"), "w") as page:
        page.write("<!DOCTYPE html>\n<html><body>\n")
        for name in names:
            page.write(f'<a href="../../files/{html.escape(name)}">{html.escape(name)}</a><br>\n')
        page.write("</body></html>\n")
EOF
    rm -rf "$TORCH_INDEX"
    mv "$partial" "$TORCH_INDEX"
}

# The arguments that point a build of target $1 at this machine's pip set-up (--local).
local_pip_args() {
    local target=$1 cert=${PIP_CERT:-${SSL_CERT_FILE:-}} links found=()
    if [[ -n "$cert" && -f "$cert" ]]; then
        printf '%s\n' --volume "$cert:$cert:ro" --build-arg "PIP_CERT=$cert"
    fi
    links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
    for dir in $links; do
        dir=${dir#file://}
        if [[ -d "$dir" ]]; then
            found+=("$dir")
            printf '%s\n' --volume "$dir:$dir:ro"
        fi
    done
    if ((${#found[@]})); then
        printf '%s\n' --build-arg "PIP_FIND_LINKS=${found[*]}"
    fi
    # PyTorch's CPU index cannot be reached: torch comes from the local copy of PyPI's.
    if [[ "$target" == xeon ]]; then
        printf '%s\n' --volume "$TORCH_INDEX:$TORCH_INDEX:ro" --build-arg "TORCH_INDEX_URL=file://$TORCH_INDEX/simple"
    fi
}

# Every build argument and option for one target, one a line.
build_options() {
    local target=$1
    if [[ "$target" == operator ]]; then
        printf '%s\n' --file "$REPO/Dockerfile"
    else
        printf '%s\n' --file "$REPO/trainer_image/Dockerfile" --target "$target"
    fi
    if [[ -n "$wheels" && ("$target" == xeon || "$target" == cuda) ]]; then
        # The layer cache does not look into the wheel directory; its digest does.
        printf '%s\n' --build-context "$target-horovod=$wheels" --build-arg "HOROVOD_WHEELS_DIGEST=$(
            cd "$wheels" && find . -type f -name '*.whl' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
        )"
    fi
    if $local_mode; then
        if [[ "$target" == operator ]]; then
            printf '%s\n' --build-arg "BASE_IMAGE=$LOCAL_BASE" --build-arg "KUBECTL_IMAGE=$LOCAL_KUBECTL"
        else
            printf '%s\n' --build-arg "XEON_BASE_IMAGE=$LOCAL_BASE"
        fi
        local_pip_args "$target"
    fi
}

if [[ "$builder" == buildah ]]; then
    storage_flags
    if $local_mode; then
        local_base
        if [[ " ${targets[*]} " == *" operator "* ]]; then local_kubectl; fi
        if [[ " ${targets[*]} " == *" xeon "* ]]; then local_torch_index; fi
    fi
fi

for target in "${targets[@]}"; do
    mapfile -t options < <(build_options "$target")
    image=$(tag "$target")
    if [[ -n "$oci_dir" ]]; then
        # The attestations ride in the index, so that the push copies them with the image.
        archive=(buildx build "${options[@]}" --platform "$platforms" --sbom=true --provenance=mode=max
            --output "type=oci,dest=$oci_dir/$target.tar,name=$image" "$REPO")
        if [[ "$builder" == print ]]; then
            printf 'docker'
            printf ' %q' "${archive[@]}"
            printf '\n'
        else
            mkdir -p "$oci_dir"
            echo "build-images.sh: building $image for $platforms into $oci_dir/$target.tar"
            docker "${archive[@]}"
        fi
        continue
    fi
    case "$builder" in
        print)
            printf 'DOCKER_BUILDKIT=1 docker build'
            printf ' %q' "${options[@]}" -t "$image" "$REPO"
            printf '\n'
            ;;
        docker)
            echo "build-images.sh: building $image with docker"
            DOCKER_BUILDKIT=1 docker build "${options[@]}" -t "$image" "$REPO"
            ;;
        buildah)
            echo "build-images.sh: building $image with buildah (storage: $CACHE/containers)"
            start=$SECONDS
            before=$(buildah_ containers --quiet --notruncate | sort)
            replaced=$(buildah_ inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
            buildah_ bud --isolation chroot --layers "${options[@]}" -t "$image" "$REPO"
            # buildah 1.28 leaves the container of a stage used only by COPY --from (kubectl),
            # mounted; only the ones this build made go.
            comm -13 <(echo "$before") <(buildah_ containers --quiet --notruncate | sort) |
                while read -r leftover; do buildah_ rm "$leftover" >/dev/null; done
            prune_replaced "$replaced" "$(buildah_ inspect --type image --format '{{.FromImageID}}' "$image")"
            echo "build-images.sh: built $image in $((SECONDS - start)) s"
            ;;
    esac
done
