#!/usr/bin/env bash
# The main job: brings up the lab (a real Kubernetes 1.20.2 control plane, bare-metal
# machines with IPMI BMCs, a switched PDU), shows it, cuts a machine's power through its BMC
# and through its PDU outlet, prints the timeline and tears everything down.
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
say "running the demo"
exec ./target/debug/palisade-lab demo
