#!/usr/bin/env bash
# Build helm/docker/Dockerfile into an OCI image without a Docker engine and without Docker Hub.
#
#   sudo helm/docker/build_local.sh            # from anywhere; root only (see below)
#
# What it does, each step skipped when its result is already there (so a rerun only rebuilds the
# application image):
#   1. installs buildah and debootstrap with apt-get when missing;
#   2. makes a local stand-in for the python:3.11-slim base: Debian bookworm minbase (debootstrap)
#      + Debian's Python 3.11 in a venv at /opt/venv put first on PATH (so `python` and `pip` are
#      that venv's, as in the official image, and PEP 668 does not refuse `pip install`);
#   3. runs `buildah bud` on the real Dockerfile with --build-arg BASE_IMAGE=<that base>, the torch
#      wheel folder of this machine mounted read-only at /wheels (--build-arg FIND_LINKS=/wheels) and
#      the PyTorch CPU index switched off (it cannot be reached here);
#   4. prints the image id, size and build time, and runs a short smoke check in the image (UID,
#      wget, `recallserve models verify`).
#
# NOTE: root only. buildah's chroot isolation bind-mounts /proc, /sys and /dev and chroots, which
# needs CAP_SYS_ADMIN and CAP_SYS_CHROOT (rootless buildah would need subuid ranges and fuse).
#
# Settings (environment variables, defaults in brackets):
#   WORKDIR_BUILD  container storage, debootstrap rootfs, logs   [/work/imagebuild]; keep it outside
#                  the repository: it grows to ~15 GB (vfs) or ~6 GB (overlay)
#   STORAGE_DRIVER overlay or vfs                                [overlay when it mounts, else vfs]
#   IMAGE          tag of the application image                  [localhost/recallserve:0.1.0]
#   BASE           tag of the local base image                   [localhost/python:3.11-slim-bookworm]
#   WHEELS_DIR     folder with the torch CPU wheel               [/opt/wheels]
#   EXTRAS         the Dockerfile's EXTRAS build arg             [""]
#   DEBIAN_MIRROR  Debian mirror for debootstrap                 [http://deb.debian.org/debian]
#   BUILD_TIMEOUT  bound on the image build, seconds             [5400]
#   EXTRA_CA_DIR   *.crt the base image trusts besides Debian's  [/usr/local/share/ca-certificates]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORKDIR_BUILD=${WORKDIR_BUILD:-/work/imagebuild}
IMAGE=${IMAGE:-localhost/recallserve:0.1.0}
BASE=${BASE:-localhost/python:3.11-slim-bookworm}
WHEELS_DIR=${WHEELS_DIR:-/opt/wheels}
EXTRAS=${EXTRAS:-}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-5400}
EXTRA_CA_DIR=${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}
# NOTE: pip >= 24.2 verifies HTTPS against the system store (truststore), so the extra CAs above
# reach pip's build-isolation subprocesses too; Debian's pip 23.0.1 uses its own certifi bundle.
# Pinned so two runs make the same base.
BASE_PIP_VERSION=24.3.1

log() { printf '[build_local %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (buildah chroot isolation needs CAP_SYS_ADMIN)"
[[ -f "$REPO/pyproject.toml" && -f "$REPO/helm/docker/Dockerfile" ]] \
  || die "cannot find the repository root above $0"
case "$WORKDIR_BUILD" in "$REPO"|"$REPO"/*) die "WORKDIR_BUILD must be outside the repository" ;; esac

# --- 1. tools ---------------------------------------------------------------------------------
missing=()
for pair in buildah:buildah debootstrap:debootstrap; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

mkdir -p "$WORKDIR_BUILD"/{storage,run,tmp,logs}
export TMPDIR="$WORKDIR_BUILD/tmp"  # NOTE: buildah stages layer diffs here; /tmp may be small

# --- storage driver: overlay when the kernel mounts it here, else vfs (full copies, ~2x disk) ---
if [[ -z ${STORAGE_DRIVER:-} ]]; then
  if [[ -f "$WORKDIR_BUILD/storage-driver" ]]; then
    STORAGE_DRIVER=$(cat "$WORKDIR_BUILD/storage-driver")
  else
    probe=$(mktemp -d "$WORKDIR_BUILD/tmp/ovl.XXXX")
    mkdir -p "$probe"/{l,u,w,m}
    if mount -t overlay overlay -o "lowerdir=$probe/l,upperdir=$probe/u,workdir=$probe/w" "$probe/m" 2>/dev/null; then
      umount "$probe/m"; STORAGE_DRIVER=overlay
    else
      STORAGE_DRIVER=vfs
    fi
    rm -rf "$probe"
    # NOTE: remembered, because images in one driver's storage are invisible to the other.
    echo "$STORAGE_DRIVER" >"$WORKDIR_BUILD/storage-driver"
  fi
fi
log "storage: $WORKDIR_BUILD/storage ($STORAGE_DRIVER)"
STORE=(--root "$WORKDIR_BUILD/storage" --runroot "$WORKDIR_BUILD/run" --storage-driver "$STORAGE_DRIVER")
bah() { buildah "${STORE[@]}" "$@"; }

# --- 2. base image -----------------------------------------------------------------------------
if bah inspect --type image "$BASE" >/dev/null 2>&1; then
  log "base $BASE exists, reused"
else
  rootfs="$WORKDIR_BUILD/rootfs-bookworm"
  if [[ ! -f "$rootfs/.debootstrap-done" ]]; then
    rm -rf "$rootfs"
    log "debootstrap bookworm (minbase + python3) into $rootfs"
    # NOTE: netbase, tzdata and ca-certificates are what python:3.11-slim adds to debian:slim.
    timeout 1800 debootstrap --variant=minbase \
      --include=ca-certificates,netbase,tzdata,python3,python3-venv,python3-pip \
      bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORKDIR_BUILD/logs/debootstrap.log" 2>&1 \
      || die "debootstrap failed, see $WORKDIR_BUILD/logs/debootstrap.log"
    # the same sources as the official Debian images: updates and security fixes too
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    touch "$rootfs/.debootstrap-done"
  fi
  # NOTE: where HTTPS goes through a TLS-inspecting proxy (as on the machines this was written on),
  # pip inside the build must trust its CA: the base takes this machine's extra CA certificates.
  # That trust ends up in the image too, which is why this base is for local images only.
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  find "$rootfs/usr/local/share/ca-certificates" -name '*.crt' -delete
  if [[ -d $EXTRA_CA_DIR ]]; then
    find "$EXTRA_CA_DIR" -maxdepth 1 -name '*.crt' -exec cp {} "$rootfs/usr/local/share/ca-certificates/" \;
  fi
  log "tar the rootfs"
  tar --numeric-owner --exclude=./.debootstrap-done -C "$rootfs" -cf "$WORKDIR_BUILD/tmp/rootfs.tar" .
  cat >"$WORKDIR_BUILD/tmp/Containerfile.base" <<EOF
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8 \\
    VIRTUAL_ENV=/opt/venv \\
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN update-ca-certificates \\
 && python3 -m venv /opt/venv \\
 && pip install --no-cache-dir --cert /etc/ssl/certs/ca-certificates.crt \\
      "pip==$BASE_PIP_VERSION" setuptools wheel \\
 && apt-get update -qq && apt-get upgrade -y -qq && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
EOF
  log "buildah bud the base $BASE"
  bah bud --isolation chroot --network host --layers=false --force-rm \
    -f "$WORKDIR_BUILD/tmp/Containerfile.base" -t "$BASE" "$WORKDIR_BUILD/tmp" \
    >"$WORKDIR_BUILD/logs/base.log" 2>&1 || die "base build failed, see $WORKDIR_BUILD/logs/base.log"
  rm -f "$WORKDIR_BUILD/tmp/rootfs.tar"
fi

# --- 3. the application image ------------------------------------------------------------------
[[ -n $(compgen -G "$WHEELS_DIR/torch-*.whl") ]] || die "no torch wheel in WHEELS_DIR=$WHEELS_DIR"
old_id=$(bah inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || true)
log "buildah bud $IMAGE (log: $WORKDIR_BUILD/logs/build.log; llama-cpp-python compiles: minutes)"
start=$(date +%s)
# NOTE: --layers=false runs every step in one working container and commits once: one copy of the
# rootfs instead of one per step. --force-rm drops that container on failure too.
timeout "$BUILD_TIMEOUT" buildah "${STORE[@]}" bud --isolation chroot --network host \
  --layers=false --force-rm \
  --volume "$WHEELS_DIR:/wheels:ro" \
  --build-arg BASE_IMAGE="$BASE" --build-arg EXTRAS="$EXTRAS" \
  --build-arg FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL= \
  -f "$REPO/helm/docker/Dockerfile" -t "$IMAGE" "$REPO" >"$WORKDIR_BUILD/logs/build.log" 2>&1 \
  || die "image build failed (or ran past ${BUILD_TIMEOUT}s), see $WORKDIR_BUILD/logs/build.log"
elapsed=$(( $(date +%s) - start ))
new_id=$(bah inspect --type image --format '{{.FromImageID}}' "$IMAGE")
if [[ -n $old_id && $old_id != "$new_id" ]]; then
  bah rmi "$old_id" >/dev/null 2>&1 || true  # the previous build of this tag, now untagged
fi

# --- 4. report and smoke check -----------------------------------------------------------------
log "built $IMAGE id ${new_id:0:12} in ${elapsed}s"
bah images "$IMAGE"
# NOTE: `buildah run` (chroot, no cgroups, no OCI runtime) works wherever the build did; `podman run`
# may not (helm/README.md says what it needs on a cgroup-hybrid host). It runs as the image's USER.
ctr=$(bah from --pull-never "$IMAGE")
trap 'bah rm "$ctr" >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC2016  # expanded by the shell inside the image
bah run --isolation chroot --network host "$ctr" -- sh -c \
  'echo "uid=$(id -u)"; command -v wget; recallserve models verify' \
  || die "smoke check failed in $IMAGE"
log "done"
