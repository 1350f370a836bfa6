#!/usr/bin/env bash
# Fault campaigns, judged by the at-most-one checker. Not part of hack/test.sh (which runs a
# short, fixed-seed sample of each): these are long, benchmark-like runs.
#   hack/chaos.sh --sim [--schedules N] [--seed S] [--bug NAME]
#       the deterministic simulation of the controller core: N seeded fault schedules
#       (default 1,000,000); a violation exits 1 with the shrunk schedule, its history and
#       the command that replays it. --bug plants a known mistake (the run must fail).
# The report is printed and saved under target/chaos/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[chaos] %s\n' "$*"; }

mode=""
schedules=1000000
seed=""
bug=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --sim) mode=sim ;;
    --schedules) schedules=$2; shift ;;
    --seed) seed=$2; shift ;;
    --bug) bug=(--bug "$2"); shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "hack/chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$mode" != sim ]; then
  echo "hack/chaos.sh: only --sim is implemented; the nemesis on the real lab is not built yet" >&2
  exit 2
fi
[ -n "$seed" ] || seed=$(( $(date +%s) % 1000000007 ))
mkdir -p target/chaos
say "building palisade-sim (release)"
cargo build --release --quiet -p palisade-sim
say "simulating $schedules schedules from seed $seed ${bug[*]:-}"
report="target/chaos/sim-seed$seed.txt"
status=0
target/release/palisade-sim --seed "$seed" --schedules "$schedules" "${bug[@]}" | tee "$report" || status=$?
say "report: $report"
exit "$status"
