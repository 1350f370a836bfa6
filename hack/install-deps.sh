#!/usr/bin/env bash
# Installs everything Palisade's lab, tests and demo need on a Debian bookworm machine.
# Idempotent: a second run only checks, and takes seconds.
#   - Debian packages: etcd, Go (to build Kubernetes), OpenIPMI's ipmi_sim, ipmitool,
#     Pacemaker (pacemaker-fenced and stonith_admin prove the fence-agents contract), xmllint,
#     Net-SNMP (snmpd + tools), ClusterLabs fence-agents (benchmark peers), iproute2, openssl,
#     Prometheus with promtool, and Debian's kubectl 1.20 (`kubernetes-client`, extracted into
#     the cache, never installed: it must not replace another kubectl the machine has).
#   - kube-apiserver, kube-controller-manager and kube-scheduler 1.20.2, built from Debian's
#     `kubernetes` source package and cached outside the repo: the oldest release Palisade
#     supports.
#   - The same three and kubectl 1.34.4, with etcd 3.6.16: the release the lab runs by default,
#     built with the machine's Go (1.24 or later) from the project's own pinned Go modules
#     (hack/kube/go.mod, hack/kube/etcd/go.mod, with their go.sum) and the Go module proxy,
#     and cached outside the repo. Neither their source nor their binaries are committed.
#     The kubelet 1.34.4 (the lab's stock machines) from the same module, in a cache of its own.
#   - For the lab's QEMU machines: qemu-system-x86, busybox-static, cpio, kmod, and Debian's
#     standard amd64 kernel, extracted (never installed) into the cache: its module tree
#     (depmod'ed) and the uncompressed `vmlinux` that QEMU boots directly (PVH entry).
#   - nftables: a peer cut of QEMU machines filters their bridged traffic (bridge family).
#   - OCI images: Debian's docker-registry (distribution 2.8; the lab's registry) and buildah
#     (hack/images.sh builds the images without a daemon).
#   - containerd and runc (Debian's): the stock runtime the companion's CRI client is proven
#     against (agents/node/tests/cri_containerd.rs runs a containerd of its own), and the CNI
#     plugins (containernetworking-plugins, only suggested by containerd) the lab's stock
#     machines give their pods.
#   - helm 4.3.1, built from its Go module (hack/helm/go.mod, go.sum) and cached outside the
#     repo, for the chart test.
#   - Redfish BMCs: sushy-tools (`sushy-emulator`) from PyPI, in a virtualenv in the cache, and
#     Debian's python3-libvirt for its libvirt backend on libvirt's in-process test driver.
set -euo pipefail

say() { printf '[install-deps] %s\n' "$*"; }

K8S_VERSION=1.20.2
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/palisade"
# The suffix names the local patch set: bump it when the build changes so caches rebuild.
K8S_BUILD="$K8S_VERSION-p1"
K8S_BIN_DIR="$CACHE_DIR/k8s-$K8S_BUILD"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PACKAGES=(etcd-server golang-go rsync openipmi ipmitool snmp snmpd fence-agents
          iproute2 openssl procps psmisc util-linux curl ca-certificates dpkg-dev
          build-essential pkg-config golang-github-modern-go-reflect2-dev
          qemu-system-x86 busybox-static cpio kmod prometheus
          pacemaker pacemaker-cli-utils libxml2-utils librsvg2-bin python3-libvirt
          docker-registry buildah faketime nftables containerd runc
          containernetworking-plugins)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  # snmpd, etcd-server, docker-registry and containerd would start system services; the lab
  # and the tests run their own instances.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  for svc in snmpd etcd prometheus pacemaker corosync docker-registry containerd; do
    if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
    $SUDO pkill -x "$svc" >/dev/null 2>&1 || true
  done
else
  say "Debian packages already installed"
fi

have_k8s() {
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    [ -s "$K8S_BIN_DIR/$b" ] && [ -x "$K8S_BIN_DIR/$b" ] || return 1
  done
}

if have_k8s; then
  say "Kubernetes $K8S_VERSION control plane cached in $K8S_BIN_DIR"
else
  say "building Kubernetes $K8S_VERSION control plane from Debian's source package (about 5 minutes on 2 cores)"
  if ! grep -rqs '^deb-src .*bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
     && ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/*.sources 2>/dev/null; then
    say "adding a deb-src entry for bookworm"
    # deb822 form, with the same keyring as the stock bookworm entry (apt refuses two Signed-By values).
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      | $SUDO tee /etc/apt/sources.list.d/palisade-src.sources >/dev/null
    $SUDO apt-get update -qq
  fi
  work="$CACHE_DIR/build.$$"
  rm -rf "$work"; mkdir -p "$work"
  trap 'rm -rf "$work"' EXIT
  ( cd "$work" && apt-get source -qq --download-only kubernetes >/dev/null 2>&1 || apt-get source -qq --download-only kubernetes )
  ( cd "$work" && dpkg-source -x --skip-patches ./kubernetes_*.dsc src >/dev/null 2>&1 || dpkg-source -x ./kubernetes_*.dsc src >/dev/null )
  src="$work/src"
  # The vendored modern-go/reflect2 v1.0.1 crashes (SIGSEGV in UnsafeIterate) under Go >= 1.18
  # on the first custom-resource write. Debian's reflect2 1.0.2 fixes it.
  say "replacing vendored modern-go/reflect2 with Debian's 1.0.2 (Go 1.19 fix)"
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/reflect2"
  rm -f "$src/vendor/github.com/modern-go/reflect2/go.mod"
  mkdir -p "$src/.go/src/k8s.io"
  ln -sfn "$src" "$src/.go/src/k8s.io/kubernetes"
  say "compiling (GOPATH mode, logs in $work/build.log)"
  if ! ( cd "$src/.go/src/k8s.io/kubernetes" && \
         GO111MODULE=off GOPATH="$src/.go" GOFLAGS="" GOCACHE="$CACHE_DIR/gocache" \
         KUBE_GIT_VERSION="v$K8S_VERSION" KUBE_GIT_TREE_STATE=clean \
         make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" ) >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log" >&2
    say "Kubernetes build failed"
    exit 1
  fi
  mkdir -p "$K8S_BIN_DIR.tmp"
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    f=$(find "$src/_output" -type f -name "$b" -size +1M | sed -n 1p)
    [ -n "$f" ] || { say "built tree has no $b"; exit 1; }
    install -m 0755 "$f" "$K8S_BIN_DIR.tmp/$b"
  done
  rm -rf "$K8S_BIN_DIR"; mv "$K8S_BIN_DIR.tmp" "$K8S_BIN_DIR"
  say "Kubernetes $K8S_VERSION binaries cached in $K8S_BIN_DIR"
fi

# The path of a Go toolchain of version 1.MINOR or later (`go` on PATH, then /usr/local/go), or
# fails.
go_at_least() {
  local g v minor
  for g in go /usr/local/go/bin/go; do
    v=$(command -v "$g" >/dev/null 2>&1 && "$g" env GOVERSION 2>/dev/null || true)
    minor=$(printf '%s' "$v" | sed -n 's/^go1\.\([0-9][0-9]*\).*/\1/p')
    if [ -n "$minor" ] && [ "$minor" -ge "$1" ]; then command -v "$g"; return 0; fi
  done
  return 1
}

# Kubernetes 1.34 and etcd 3.6, built as Go modules from hack/kube (pinned by its go.mod and
# go.sum; the staging modules replaced by their published v0.34 versions).
K8S_CURRENT=1.34.4
K8S_CURRENT_DIR="$CACHE_DIR/k8s-$K8S_CURRENT-m1"
HACK_KUBE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kube"
# Builds Kubernetes commands (package paths) from hack/kube into the directory or file $1 with
# $GO, stamped with the release's version.
k8s_build() {
  local out=$1; shift
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_CURRENT"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  ( cd "$HACK_KUBE" && GOFLAGS=-mod=readonly nice -n 10 "$GO" build -trimpath -ldflags "$ldflags" \
      -o "$out" "$@" )
}
have_current() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd; do
    [ -s "$K8S_CURRENT_DIR/$b" ] && [ -x "$K8S_CURRENT_DIR/$b" ] || return 1
  done
}
if have_current; then
  say "Kubernetes $K8S_CURRENT control plane and etcd cached in $K8S_CURRENT_DIR"
else
  # Debian bookworm's Go is too old for Kubernetes 1.34: take the machine's current toolchain.
  GO=$(go_at_least 24) || { say "Kubernetes $K8S_CURRENT needs Go 1.24 or later (go or /usr/local/go/bin/go)"; exit 1; }
  say "building Kubernetes $K8S_CURRENT and etcd 3.6 from Go modules with $("$GO" env GOVERSION) (about 15 minutes on 2 cores)"
  rm -rf "$K8S_CURRENT_DIR.tmp"; mkdir -p "$K8S_CURRENT_DIR.tmp"
  k8s_build "$K8S_CURRENT_DIR.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl
  ( cd "$HACK_KUBE/etcd" && GOFLAGS=-mod=readonly nice -n 10 "$GO" build -trimpath -ldflags "-s -w" \
      -o "$K8S_CURRENT_DIR.tmp/etcd" go.etcd.io/etcd/server/v3 )
  rm -rf "$K8S_CURRENT_DIR"; mv "$K8S_CURRENT_DIR.tmp" "$K8S_CURRENT_DIR"
  say "Kubernetes $K8S_CURRENT and etcd cached in $K8S_CURRENT_DIR"
fi

# The kubelet 1.34.4 for the lab's stock machines, built from the same module as the control
# plane (same pins, same ldflags) into a cache directory of its own, so that adding it did not
# rebuild the cached control plane.
KUBELET_DIR="$CACHE_DIR/kubelet-$K8S_CURRENT-m1"
if [ -s "$KUBELET_DIR/kubelet" ] && [ -x "$KUBELET_DIR/kubelet" ]; then
  say "kubelet $K8S_CURRENT cached in $KUBELET_DIR"
else
  GO=$(go_at_least 24) || { say "the kubelet $K8S_CURRENT needs Go 1.24 or later (go or /usr/local/go/bin/go)"; exit 1; }
  say "building the kubelet $K8S_CURRENT from Go modules with $("$GO" env GOVERSION) (about 5 minutes on 2 cores)"
  rm -rf "$KUBELET_DIR.tmp"; mkdir -p "$KUBELET_DIR.tmp"
  k8s_build "$KUBELET_DIR.tmp/kubelet" k8s.io/kubernetes/cmd/kubelet
  rm -rf "$KUBELET_DIR"; mv "$KUBELET_DIR.tmp" "$KUBELET_DIR"
  say "kubelet $K8S_CURRENT cached in $KUBELET_DIR"
fi

# Helm 4, built as a Go module from hack/helm (pinned by its go.mod and go.sum): the chart
# test lints, templates, installs and upgrades charts/palisade with it.
HELM_VERSION=4.3.1
HELM_DIR="$CACHE_DIR/helm-$HELM_VERSION"
if [ -x "$HELM_DIR/helm" ]; then
  say "helm $HELM_VERSION cached in $HELM_DIR"
else
  GO=$(go_at_least 26) || { say "helm $HELM_VERSION needs Go 1.26 or later (go or /usr/local/go/bin/go)"; exit 1; }
  say "building helm $HELM_VERSION from its Go module with $("$GO" env GOVERSION) (a few minutes on 2 cores)"
  rm -rf "$HELM_DIR.tmp"; mkdir -p "$HELM_DIR.tmp"
  ( cd "$(dirname "${BASH_SOURCE[0]}")/helm" && GOFLAGS=-mod=readonly nice -n 10 "$GO" build -trimpath \
      -ldflags "-s -w" -o "$HELM_DIR.tmp/helm" helm.sh/helm/v4/cmd/helm )
  rm -rf "$HELM_DIR"; mv "$HELM_DIR.tmp" "$HELM_DIR"
  say "helm $HELM_VERSION cached in $HELM_DIR"
fi

# Debian's kubectl 1.20, the version of the oldest API server the lab runs.
KUBECTL="$CACHE_DIR/kubectl-1.20/kubectl"
if [ -x "$KUBECTL" ]; then
  say "kubectl 1.20 cached at $KUBECTL"
else
  kcwork="$CACHE_DIR/kubectl.$$"
  rm -rf "$kcwork"; mkdir -p "$kcwork/tree" "$(dirname "$KUBECTL")"
  ( cd "$kcwork" && { apt-get download -qq kubernetes-client >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq && apt-get download -qq kubernetes-client; }; } )
  dpkg-deb -x "$kcwork"/kubernetes-client_*.deb "$kcwork/tree"
  install -m 0755 "$kcwork/tree/usr/bin/kubectl" "$KUBECTL.tmp" && mv "$KUBECTL.tmp" "$KUBECTL"
  rm -rf "$kcwork"
  say "kubectl $("$KUBECTL" version --client --short 2>/dev/null || true) cached at $KUBECTL"
fi

# Guest kernel for QEMU lab machines. The cache directory is complete only once `vmlinux`
# exists (it is written last), so an interrupted run is redone rather than half-trusted.
GUEST_KERNEL_DIR="$CACHE_DIR/guest-kernel"
if [ -s "$GUEST_KERNEL_DIR/vmlinux" ] && [ -s "$GUEST_KERNEL_DIR/version" ]; then
  say "guest kernel $(cat "$GUEST_KERNEL_DIR/version") cached in $GUEST_KERNEL_DIR"
else
  # The standard flavour: the cloud flavour lacks i6300esb, IPMI and 9p.
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9].*-amd64/{print $2; exit}')
  [ -n "$kpkg" ] || { say "no linux-image-*-amd64 package known to apt"; exit 1; }
  say "extracting guest kernel $kpkg into $GUEST_KERNEL_DIR"
  kwork="$CACHE_DIR/kernel.$$"
  rm -rf "$kwork" "$GUEST_KERNEL_DIR"; mkdir -p "$kwork/tree"
  ( cd "$kwork" && apt-get download -qq "$kpkg" >/dev/null 2>&1 || apt-get download -qq "$kpkg" )
  dpkg-deb -x "$kwork"/"$kpkg"_*.deb "$kwork/tree"
  kv=$(ls "$kwork/tree/lib/modules")
  depmod -b "$kwork/tree" "$kv"
  # The bzImage payload is xz; QEMU boots the uncompressed ELF (PVH), skipping SeaBIOS and
  # the in-guest decompression (seconds under TCG).
  python3 - "$kwork/tree/boot/vmlinuz-$kv" "$kwork/vmlinux" <<'PY'
import lzma, sys
d = open(sys.argv[1], 'rb').read()
i = d.find(b'\xfd7zXZ\x00')
if i < 0:
    sys.exit('no xz payload in ' + sys.argv[1])
open(sys.argv[2], 'wb').write(lzma.LZMADecompressor().decompress(d[i:]))
PY
  if ! readelf -n "$kwork/vmlinux" | grep -q '(0x00000012)'; then  # XEN_ELFNOTE_PHYS32_ENTRY
    say "extracted vmlinux has no PVH entry note"; rm -rf "$kwork"; exit 1
  fi
  rm -rf "$GUEST_KERNEL_DIR.tmp"; mkdir -p "$GUEST_KERNEL_DIR.tmp"
  mv "$kwork/tree/lib" "$GUEST_KERNEL_DIR.tmp/lib"
  echo "$kv" > "$GUEST_KERNEL_DIR.tmp/version"
  mv "$kwork/vmlinux" "$GUEST_KERNEL_DIR.tmp/vmlinux"
  rm -rf "$kwork" "$GUEST_KERNEL_DIR"; mv "$GUEST_KERNEL_DIR.tmp" "$GUEST_KERNEL_DIR"
  say "guest kernel $kv cached in $GUEST_KERNEL_DIR"
fi

# Redfish BMCs for the lab: sushy-tools' `sushy-emulator` (PyPI) in a virtualenv in the cache.
# A virtualenv is not relocatable (its scripts name its path), so it is built in place and
# marked complete (`.palisade-complete`, written last): an interrupted run is redone.
SUSHY_VERSION=2.2.0
SUSHY_VENV="$CACHE_DIR/sushy-tools-$SUSHY_VERSION"
if [ -f "$SUSHY_VENV/.palisade-complete" ] && [ -x "$SUSHY_VENV/bin/sushy-emulator" ]; then
  say "sushy-tools $SUSHY_VERSION cached in $SUSHY_VENV"
else
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    say "installing python3-venv (python3 -m venv is missing)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  say "installing sushy-tools $SUSHY_VERSION from PyPI into $SUSHY_VENV"
  rm -rf "$SUSHY_VENV"
  python3 -m venv "$SUSHY_VENV"
  nice -n 19 "$SUSHY_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "sushy-tools==$SUSHY_VERSION"
  # The lab writes bcrypt htpasswd files with the emulator's own bcrypt (sushy accepts no other).
  "$SUSHY_VENV/bin/python" -c 'import bcrypt, sushy_tools.emulator.main' \
    || { say "sushy-tools installed but does not import"; exit 1; }
  touch "$SUSHY_VENV/.palisade-complete"
  say "sushy-tools $("$SUSHY_VENV/bin/pip" show sushy-tools 2>/dev/null | awk '/^Version:/{print $2}') installed in $SUSHY_VENV"
fi

# An independent IPMI BMC for palisade-fence's tests (agents/fence/tests/pyghmi.rs): pyghmi
# (PyPI), the base of virtualbmc, in its own virtualenv in the cache, built and marked
# complete like sushy-tools' above.
PYGHMI_VERSION=1.6.19
PYGHMI_VENV="$CACHE_DIR/pyghmi-$PYGHMI_VERSION"
if [ -f "$PYGHMI_VENV/.palisade-complete" ] && [ -x "$PYGHMI_VENV/bin/python" ]; then
  say "pyghmi $PYGHMI_VERSION cached in $PYGHMI_VENV"
else
  say "installing pyghmi $PYGHMI_VERSION from PyPI into $PYGHMI_VENV"
  rm -rf "$PYGHMI_VENV"
  python3 -m venv "$PYGHMI_VENV"
  nice -n 19 "$PYGHMI_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "pyghmi==$PYGHMI_VERSION"
  "$PYGHMI_VENV/bin/python" -c 'import pyghmi.ipmi.bmc' \
    || { say "pyghmi installed but does not import"; exit 1; }
  touch "$PYGHMI_VENV/.palisade-complete"
  say "pyghmi $PYGHMI_VERSION installed in $PYGHMI_VENV"
fi

"$K8S_BIN_DIR/kube-apiserver" --version
"$K8S_CURRENT_DIR/kube-apiserver" --version
"$K8S_CURRENT_DIR/etcd" --version | sed -n 1p
"$KUBELET_DIR/kubelet" --version
say "done"
