#!/usr/bin/env bash
# Benchmarks, side by side with the peer tools in the same run, against the same lab
# simulators. Not part of hack/test.sh: tests assert behaviour, benchmarks measure.
#   hack/bench.sh            every benchmark
#   hack/bench.sh agents     only one (agents | storage | bridge | node | recovery | scale)
#   hack/bench.sh recovery   both machine kinds, each on Kubernetes 1.20 and 1.34 side by side,
#                            a cut and a power loss (switched off at the BMC), 20 runs of each
#                            (RECOVERY_RUNS=3 hack/bench.sh recovery for a quick look; 20 runs
#                            take about 2 hours on 2 cores, by the samples' ~30 s per namespace
#                            run and ~50 s per QEMU run); RECOVERY_KIND=netns|qemu and
#                            RECOVERY_KUBE=1.20|1.34 narrow it; RECORD=1 then copies the
#                            figures to docs/data/recovery.json and the page generated from
#                            them to docs/recovery-report.md
# Results are printed as tables with medians (p50) and ratios, and saved under target/bench/
# (recovery and scale also as JSON; recovery's p50/p99/max tables as Markdown beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[bench] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/bench.sh must run as root: the lab creates network and PID namespaces" >&2
  exit 1
fi
bash hack/install-deps.sh
export PALISADE_BIN_DIR="$PWD/target/release"
mkdir -p target/bench

# run NAME BIN [cargo build args...] -- [bench args...]: builds what the bench needs (release,
# with the lab's helper binary), then runs it and keeps its table.
run() {
  local name=$1 bin=$2; shift 2
  local build=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do build+=("$1"); shift; done
  shift || true
  say "$name: building (release)"
  cargo build --release --quiet -p palisade-lab --bins "${build[@]}"
  say "$name: $bin $*"
  "target/release/$bin" "$@" | tee "target/bench/$name.txt"
}

want="${1:-all}"
if [ "$want" = all ] || [ "$want" = agents ]; then
  run agents palisade-fence-bench -p palisade-fence --features palisade-fence/bench --
fi
if [ "$want" = all ] || [ "$want" = storage ]; then
  run storage palisade-storage-bench -p palisade-labstore -- --rounds 50 --seconds 5
fi
if [ "$want" = all ] || [ "$want" = bridge ]; then
  run bridge bridge-bench -p palisade-bridge --
fi
if [ "$want" = all ] || [ "$want" = node ]; then
  run node node-bench -p palisade-node-bench -p palisade-node -p palisade-controller -- 100
fi
if [ "$want" = all ] || [ "$want" = recovery ]; then
  run recovery palisade-recovery-bench -p palisade-scenario -p palisade-node \
    -p palisade-controller -p palisade-bridge -p palisade-labstore -- \
    --kind "${RECOVERY_KIND:-both}" --kube "${RECOVERY_KUBE:-both}" --fault both \
    --runs "${RECOVERY_RUNS:-20}" --without-seconds 90 --out target/bench/recovery.json
  if [ "${RECORD:-0}" = 1 ]; then
    mkdir -p docs/data
    cp target/bench/recovery.json docs/data/recovery.json
    cp target/bench/recovery.md docs/recovery-report.md
    say "recovery: recorded in docs/data/recovery.json and docs/recovery-report.md"
  fi
fi
if [ "$want" = all ] || [ "$want" = scale ]; then
  # 2,000 simulated nodes; 100 go silent within 2 s (one every 20 ms).
  run scale palisade-scale-bench -p palisade-scale-bench -p palisade-controller -- \
    --nodes 2000 --silence 100 --silence-every 0.02 --out target/bench/scale.json
fi
say "done; results in target/bench/"
