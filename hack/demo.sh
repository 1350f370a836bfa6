#!/usr/bin/env bash
# The main job, on the embedded lab (a real Kubernetes 1.20.2 control plane, bare-metal
# machines running palisade-node with IPMI BMCs, a switched PDU, a storage server):
#   1. a StatefulSet's writer runs on machine m0 and appends to a volume;
#   2. m0 is cut off the network;
#   3. palisade-controller detects it, fences it (IPMI power off and storage block, both
#      verified), releases the pod, and the replacement writes from another machine;
#   4. the at-most-one checker gives its verdict; a timeline is printed; all is torn down.
#   5. the lab tour: palisade-fence fences one machine through its BMC and another through
#      its PDU outlet (verified off, then on), cross-checked with ipmitool and snmpget.
# `hack/demo.sh lab` runs only the tour.
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
if [ "${1:-}" = lab ]; then
  say "running the lab tour"
  exec ./target/debug/palisade-lab demo
fi
say "running the fencing demo"
./target/debug/palisade-demo
echo
say "running the lab tour"
exec ./target/debug/palisade-lab demo
