#!/usr/bin/env bash
# Builds Palisade's OCI images from the release binaries with buildah (no daemon):
# FROM scratch, the binary and the shared libraries it loads (glibc and the dynamic loader,
# found with ldd), a non-root user (65532), and the org.opencontainers.image.* labels.
#
#   hack/images.sh                      build, export to target/images/oci, record digests
#   hack/images.sh --push HOST:PORT     also push to that registry over TLS
#       --ca FILE        CA certificate of the registry (default: none, system roots)
#       --authfile FILE  registry credentials (containers-auth.json format), never on the
#                        command line
#       --no-build       do not run cargo build --release first
#       --only NAME      only this image (controller, bridge, node, companion, writer,
#                        storage-server, attacher)
#
# Images: palisade/controller, palisade/bridge (firmware-bridge, for those who run it in a
# container), palisade/node (palisade-node, root), palisade/companion (palisade-companion,
# root), and the lab's workloads: palisade/writer,
# palisade/storage-server and palisade/attacher. Their
# digests are printed and written to target/images/digests.txt (`name@sha256:...`, and
# `host:port/name@sha256:...` for what was pushed: the registry gets recompressed layers).
set -euo pipefail

say() { printf '[images] %s\n' "$*"; }

cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
OUT="$TARGET/images"
PUSH=""
CA=""
AUTHFILE=""
BUILD=1
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --push) PUSH="$2"; shift 2 ;;
    --ca) CA="$2"; shift 2 ;;
    --authfile) AUTHFILE="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

command -v buildah >/dev/null || { say "buildah is missing: run hack/install-deps.sh"; exit 1; }

VERSION=$(awk -F'"' '/^\[workspace.package\]/{p=1} p && /^version/{print $2; exit}' Cargo.toml)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The origin remote, without any user info a URL may carry.
SOURCE=$(git remote get-url origin 2>/dev/null | sed -E 's#://[^/@]*@#://#' || true)
SOURCE=${SOURCE:-unknown}

# name  cargo package  binary  user
# The node agent runs as root (it creates the containers' namespaces and cgroups, and pets
# the watchdog), and so does the companion (the runtime's socket and the machine's UUID are
# root's, controller/manifests/companion/daemonset.yaml); everything else runs as 65532.
IMAGES=(
  "writer palisade-labstore palisade-writer 65532:65532"
  "controller palisade-controller palisade-controller 65532:65532"
  "bridge palisade-bridge firmware-bridge 65532:65532"
  "node palisade-node palisade-node 0:0"
  "companion palisade-node palisade-companion 0:0"
  "storage-server palisade-labstore palisade-storage-server 65532:65532"
  "attacher palisade-labstore palisade-attacher 65532:65532"
)
if [ -n "$ONLY" ]; then
  for spec in "${IMAGES[@]}"; do [ "${spec%% *}" = "$ONLY" ] && IMAGES=("$spec") && break; done
  [ "${IMAGES[0]%% *}" = "$ONLY" ] || { say "no image named $ONLY"; exit 2; }
fi

if [ "$BUILD" = 1 ]; then
  for spec in "${IMAGES[@]}"; do
    read -r _ pkg bin _ <<<"$spec"
    say "cargo build --release -p $pkg --bin $bin"
    nice -n 10 cargo build --release -q -p "$pkg" --bin "$bin"
  done
fi

# Root runs buildah with its default storage; elsewhere, rootless with vfs.
export BUILDAH_ISOLATION=chroot
STORAGE=(--storage-driver vfs)
mkdir -p "$OUT"
: >"$OUT/digests.txt.new"
for spec in "${IMAGES[@]}"; do
  read -r name _ bin user <<<"$spec"
  binary="$TARGET/release/$bin"
  [ -x "$binary" ] || { say "$binary is missing (run without --no-build)"; exit 1; }
  ref="palisade/$name:$VERSION"
  say "building $ref from $binary"
  ctr=$(buildah "${STORAGE[@]}" from --quiet scratch)
  trap 'buildah "${STORAGE[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  buildah "${STORAGE[@]}" copy --quiet --chmod 0755 "$ctr" "$binary" "/usr/local/bin/$bin" >/dev/null
  # The shared libraries and the loader, at the paths the binary asks for.
  for lib in $(ldd "$binary" | awk '/=> \//{print $3} /^\s*\/[^ ]+ \(/{print $1}' | sort -u); do
    real=$(readlink -f "$lib")
    buildah "${STORAGE[@]}" copy --quiet "$ctr" "$real" "$lib" >/dev/null
  done
  buildah "${STORAGE[@]}" config \
    --entrypoint "[\"/usr/local/bin/$bin\"]" --cmd '[]' \
    --user "$user" --workingdir / \
    --env PATH=/usr/local/bin \
    --label "org.opencontainers.image.title=palisade-$name" \
    --label "org.opencontainers.image.version=$VERSION" \
    --label "org.opencontainers.image.revision=$REVISION" \
    --label "org.opencontainers.image.source=$SOURCE" \
    --os linux --arch amd64 "$ctr"
  buildah "${STORAGE[@]}" commit --quiet --format oci --rm "$ctr" "$ref" >/dev/null
  trap - EXIT
  buildah "${STORAGE[@]}" push --quiet --digestfile "$OUT/$name.digest" "$ref" "oci:$OUT/oci:$name-$VERSION"
  digest=$(cat "$OUT/$name.digest")
  say "$ref $digest"
  echo "$ref@$digest" >>"$OUT/digests.txt.new"
  if [ -n "$PUSH" ]; then
    args=(--digestfile "$OUT/$name.pushed-digest")
    if [ -n "$CA" ]; then
      certs=$(mktemp -d); cp "$CA" "$certs/ca.crt"; args+=(--cert-dir "$certs")
    fi
    [ -n "$AUTHFILE" ] && args+=(--authfile "$AUTHFILE")
    say "pushing $ref to $PUSH"
    buildah "${STORAGE[@]}" push --quiet "${args[@]}" "$ref" "docker://$PUSH/$ref"
    [ -n "$CA" ] && rm -rf "$certs"
    # The registry gets freshly compressed layers: the pushed digest is its own.
    pushed="$PUSH/$ref@$(cat "$OUT/$name.pushed-digest")"
    say "pushed $pushed"
    echo "$pushed" >>"$OUT/digests.txt.new"
  fi
done
mv "$OUT/digests.txt.new" "$OUT/digests.txt"
say "digests recorded in $OUT/digests.txt"
