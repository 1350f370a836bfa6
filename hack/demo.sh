#!/usr/bin/env bash
# The main job, on the embedded lab (a real Kubernetes 1.34 control plane, bare-metal
# machines running palisade-node with IPMI BMCs, a switched PDU, a storage server):
#   1. a StatefulSet's writer runs on machine m0 and appends to a volume;
#   2. m0 is cut off the network;
#   3. palisade-controller detects it, fences it (IPMI power off and storage block, both
#      verified), releases the pod, and the replacement writes from another machine;
#   4. the at-most-one checker gives its verdict; a timeline is printed; all is torn down.
#   5. the lab tour: palisade-fence fences one machine through its BMC and another through
#      its PDU outlet (verified off, then on), cross-checked with ipmitool and snmpget.
# The machines are QEMU virtual machines (TCG) whose BMCs are ipmi_sim: an IPMI power off really
# stops the VM, and a power on boots it with a new boot ID.
#   hack/demo.sh            the fencing demo, then the lab tour, on QEMU machines
#   hack/demo.sh --netns    the same on namespace machines (boot in milliseconds)
#   hack/demo.sh --in-cluster
#                           the controller runs in the cluster: installed from its manifests
#                           (kubectl apply -k) with its image pulled from the lab's registry
#                           (combines with --netns)
#   hack/demo.sh lab        only the tour (also: hack/demo.sh lab --netns)
#   hack/demo.sh --kube=1.20
#                           on Kubernetes 1.20, the oldest release Palisade supports
#                           (PALISADE_KUBE=1.20 does the same; 1.34 is the default)
# Needs root: the lab creates network and PID namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[demo] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/demo.sh must run as root: the lab creates network and PID namespaces" >&2
  exit 1
fi

say "installing dependencies"
bash hack/install-deps.sh
say "building"
cargo build --workspace --bins --quiet
tour_only=0
kind=()
where=()
for arg in "$@"; do
  case "$arg" in
    lab) tour_only=1 ;;
    --netns) kind=(--netns) ;;
    --in-cluster) where=(--in-cluster) ;;
    --kube=*) export PALISADE_KUBE="${arg#--kube=}" ;;
    *) echo "usage: hack/demo.sh [lab] [--netns] [--in-cluster] [--kube=1.20|1.34]" >&2; exit 2 ;;
  esac
done
if [ "$tour_only" = 1 ]; then
  say "running the lab tour"
  exec ./target/debug/palisade-lab demo "${kind[@]}"
fi
say "running the fencing demo"
./target/debug/palisade-demo "${kind[@]}" "${where[@]}"
echo
say "running the lab tour"
exec ./target/debug/palisade-lab demo "${kind[@]}"
