#!/usr/bin/env bash
# Benchmarks, side by side with the peer tools in the same run, against the same lab
# simulators. Not part of hack/test.sh: tests assert behaviour, benchmarks measure.
#   hack/bench.sh            every benchmark
#   hack/bench.sh agents     only one (agents | storage | bridge | powerwatch | node | recovery |
#                            scale | scale10k)
#   hack/bench.sh recovery   both machine kinds, each on Kubernetes 1.20 and 1.34 side by side,
#                            a cut and a power loss (switched off at the BMC), 20 runs of each
#                            (RECOVERY_RUNS=3 hack/bench.sh recovery for a quick look; 20 runs
#                            take about 2 hours on 2 cores, by the samples' ~30 s per namespace
#                            run and ~50 s per QEMU run); RECOVERY_KIND=netns|qemu and
#                            RECOVERY_KUBE=1.20|1.34 narrow it; RECORD=1 then copies the
#                            figures to docs/data/recovery.json and the page generated from
#                            them to docs/recovery-report.md
#   RECORD=1 hack/bench.sh NAME   also keeps the figures in the repository: each bench's JSON
#                            as docs/data/bench-NAME.json (recovery's as above), and
#                            regenerates docs/benchmarks.md from docs/data/ (a test keeps the
#                            page in step with the data)
# Results are printed as tables with medians (p50) and ratios, and saved under target/bench/:
# NAME.txt (the table) and NAME.json (p50 and p99 of every figure beside the peer's, with the
# date, the commit, the build and the machine's core count and load average; recovery's
# p50/p99/max tables also as Markdown beside it).
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

# record NAME: with RECORD=1, keeps target/bench/NAME.json as docs/data/bench-NAME.json.
recorded=0
record() {
  if [ "${RECORD:-0}" = 1 ]; then
    mkdir -p docs/data
    cp "target/bench/$1.json" "docs/data/bench-$1.json"
    recorded=1
    say "$1: recorded in docs/data/bench-$1.json"
  fi
}

want="${1:-all}"
if [ "$want" = all ] || [ "$want" = agents ]; then
  run agents palisade-fence-bench -p palisade-fence --features palisade-fence/bench -- \
    --out target/bench/agents.json
  record agents
fi
if [ "$want" = all ] || [ "$want" = storage ]; then
  run storage palisade-storage-bench -p palisade-labstore -- --rounds 50 --seconds 5 \
    --out target/bench/storage.json
  record storage
fi
if [ "$want" = all ] || [ "$want" = bridge ]; then
  run bridge bridge-bench -p palisade-bridge --features palisade-bridge/bench -- \
    --out target/bench/bridge.json
  record bridge
fi
if [ "$want" = all ] || [ "$want" = powerwatch ]; then
  # 1,000 BMC responders (one UDP socket each) in the bench's process, the firmware-bridge in
  # its own: the bench needs about 1,300 open files (a higher limit is left as it is).
  if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 2048 ]; then
    say "powerwatch: raising the open files limit to 2048"
    ulimit -n 2048
  fi
  run powerwatch power-watch-bench -p palisade-bridge --features palisade-bridge/bench -- \
    --bmcs 1000 --rounds 10 --interval-ms 1000 --sample 100 --out target/bench/powerwatch.json
  record powerwatch
fi
if [ "$want" = all ] || [ "$want" = node ]; then
  run node node-bench -p palisade-node-bench -p palisade-node -p palisade-controller -- 100 \
    --out target/bench/node.json
  record node
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
    recorded=1
    say "recovery: recorded in docs/data/recovery.json and docs/recovery-report.md"
  fi
fi
if [ "$want" = all ] || [ "$want" = scale ]; then
  # 2,000 simulated nodes; 100 go silent within 2 s (one every 20 ms).
  run scale palisade-scale-bench -p palisade-scale-bench -p palisade-controller -- \
    --nodes 2000 --silence 100 --silence-every 0.02 --out target/bench/scale.json
  record scale
fi
if [ "$want" = all ] || [ "$want" = scale10k ]; then
  # 10,000 simulated nodes; 500 go silent within a second (one every 2 ms).
  run scale10k palisade-scale-bench -p palisade-scale-bench -p palisade-controller -- \
    --nodes 10000 --silence 500 --silence-every 0.002 --deadline 900 --out target/bench/scale10k.json
  record scale10k
fi
if [ "$recorded" = 1 ]; then
  say "rewriting docs/benchmarks.md from docs/data/"
  PALISADE_WRITE_REPORTS=1 cargo test --quiet -p palisade-test-support --test benchmarks_page
fi
say "done; results in target/bench/"
