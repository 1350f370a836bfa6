#!/usr/bin/env bash
# Benchmarks, side by side with the peer tools in the same run, against the same lab
# simulators. Not part of hack/test.sh: tests assert behaviour, benchmarks measure.
#   hack/bench.sh            every benchmark
#   hack/bench.sh agents     only one (agents | storage | bridge)
# Results are printed as tables with medians and ratios, and saved under target/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[bench] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/bench.sh must run as root: the lab creates network and PID namespaces" >&2
  exit 1
fi
bash hack/install-deps.sh
say "building (release)"
cargo build --release --workspace --bins --features palisade-fence/bench --quiet
export PALISADE_BIN_DIR="$PWD/target/release"
mkdir -p target/bench

run() {
  local name=$1 bin=$2; shift 2
  if [ -x "target/release/$bin" ]; then
    say "$name: $bin $*"
    "target/release/$bin" "$@" | tee "target/bench/$name.txt"
  else
    say "$name: target/release/$bin is not built; skipped"
  fi
}

want="${1:-all}"
[ "$want" = all ] || [ "$want" = agents ] && run agents palisade-fence-bench
[ "$want" = all ] || [ "$want" = storage ] && run storage palisade-storage-bench
[ "$want" = all ] || [ "$want" = bridge ] && run bridge bridge-bench
say "done; results in target/bench/"
