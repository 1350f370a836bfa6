#!/usr/bin/env bash
# Runs every Palisade test on this machine: installs what is missing (Debian packages and
# the Kubernetes 1.20.2 control plane, cached), checks formatting and lints, builds, and runs
# the whole suite against the real parts (control plane, ipmi_sim, snmpd, namespaces).
# Needs root: the lab creates network and PID namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[test] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/test.sh must run as root: the lab creates network and PID namespaces" >&2
  exit 1
fi

say "installing dependencies"
bash hack/install-deps.sh

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

say "building binaries and tests"
cargo build --workspace --bins --tests --quiet

# Each lab test brings up its own lab (several run side by side); two at a time suits 2 cores.
threads="${PALISADE_TEST_THREADS:-2}"
say "running the suite (${threads} test threads per binary)"
cargo test --workspace --no-fail-fast -- --test-threads="$threads"
