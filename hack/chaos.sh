#!/usr/bin/env bash
# Fault campaigns, judged by the at-most-one checker. Not part of hack/test.sh (which runs a
# short, fixed-seed sample of each): these are long, benchmark-like runs.
#   hack/chaos.sh --sim [--schedules N] [--seed S] [--bug NAME] [--joins] [--record]
#       the deterministic simulation of the controller core: N seeded fault schedules
#       (default 1,000,000); a violation exits 1 with the shrunk schedule, its history and
#       the command that replays it. --bug plants a known mistake (the run must fail).
#       --joins grows the cluster while part of it is cut off in every schedule (a quarter without).
#       --record appends the campaign and every planted control's verdict to
#       docs/data/simulation.jsonl and regenerates docs/simulation-report.md from it.
#   hack/chaos.sh --lab [--seed S] [--events N] [--minutes M] [--machines K] [--writers W]
#                 [--plant BUG]... [--only CLASS]... [--no-fence-devices] [--qemu [--no-watchdog]]
#                 [--print-schedule] [--record [--conditions TEXT]]
#       the nemesis on the real lab (as root): one lab of K namespace machines (default 5),
#       or with --qemu K QEMU virtual machines (TCG; the agents and pods run in the guests,
#       and the machine-clock-step class steps a guest's own wall clock),
#       W StatefulSet writers (default 2), N seeded fault events (default 20) applied and
#       healed while they write, no new event after M minutes (default 60); the history
#       (JSON lines) and the report go to target/chaos/lab-seed<S>/. Exit 1 on a violation,
#       3 if a writer did not recover after the last heal; both print the replay command.
#       --plant TrustCommand|ReleaseUnverified|ReleaseUncovered|IgnoreStaleTokens|
#       TrustWithoutWatchdog plants a known mistake in the (debug) bridge and controllers: the
#       campaign must then fail. --only draws only the named fault classes (--only list
#       prints them). --no-fence-devices creates no FenceTarget and trusts watchdog-backed
#       self-fences (namespace machines have no watchdog: nothing may be released; QEMU
#       machines' agents arm a real one, unless --no-watchdog).
#       --print-schedule prints the events the seed draws (JSON lines) and starts no lab.
#       --record appends the finished campaign (date, commit, build, figures, violations) to
#       docs/data/campaigns.jsonl and regenerates docs/campaign-report.md from it; --conditions
#       says what else the machine was doing (e.g. "the machine shared with a build").
# The report is printed and saved under target/chaos/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
say() { printf '[chaos] %s\n' "$*"; }

mode=""
schedules=1000000
seed=""
bug=()
joins=()
record=0
conditions=()
lab_args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --sim) mode=sim ;;
    --lab) mode=lab ;;
    --schedules) schedules=$2; shift ;;
    --seed) seed=$2; shift ;;
    --bug) bug=(--bug "$2"); shift ;;
    --joins) joins=(--joins) ;;
    --record) record=1 ;;
    --events|--minutes|--machines|--writers) lab_args+=("$1" "$2"); shift ;;
    --plant) lab_args+=(--plant "$2"); shift ;;
    --only) lab_args+=(--only "$2"); shift ;;
    --no-fence-devices) lab_args+=(--no-fence-devices) ;;
    --qemu) lab_args+=(--qemu) ;;
    --no-watchdog) lab_args+=(--no-watchdog) ;;
    --print-schedule) lab_args+=(--print-schedule) ;;
    --conditions) conditions=("$2"); shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "hack/chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$mode" ]; then
  echo "hack/chaos.sh: choose --sim or --lab (see --help)" >&2
  exit 2
fi
if [ "$mode" = sim ] && [ "${#lab_args[@]}" -gt 0 ]; then
  echo "hack/chaos.sh: ${lab_args[0]} is a --lab option" >&2
  exit 2
fi
if [ "$mode" = sim ] && [ "${#conditions[@]}" -gt 0 ]; then
  echo "hack/chaos.sh: --conditions is a --lab option" >&2
  exit 2
fi
[ -n "$seed" ] || seed=$(( $(date +%s) % 1000000007 ))
mkdir -p target/chaos
if [ "$mode" = lab ]; then
  if [ "${#bug[@]}" -gt 0 ] || [ "${#joins[@]}" -gt 0 ]; then
    echo "hack/chaos.sh: --bug and --joins are --sim options (the lab plants bugs with --plant)" >&2
    exit 2
  fi
  if [ "${#conditions[@]}" -gt 0 ] && [ "$record" = 0 ]; then
    echo "hack/chaos.sh: --conditions goes with --record" >&2
    exit 2
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "hack/chaos.sh --lab must run as root: the lab creates network and PID namespaces" >&2
    exit 1
  fi
  say "installing dependencies"
  bash hack/install-deps.sh
  say "building the nemesis and the binaries the lab runs (debug, as hack/test.sh)"
  cargo build --quiet --bins -p palisade-nemesis -p palisade-controller -p palisade-node \
    -p palisade-bridge -p palisade-lab -p palisade-labstore
  bin_dir="${CARGO_TARGET_DIR:-target}/debug"
  out="target/chaos/lab-seed$seed"
  rec=()
  if [ "$record" = 1 ]; then
    # As root in a checkout someone else owns, git asks for the directory to be declared safe.
    commit=$(git -c safe.directory="$PWD" rev-parse --short HEAD)
    git -c safe.directory="$PWD" diff --quiet HEAD -- || commit="$commit-dirty"
    rec=(--record docs/data/campaigns.jsonl --commit "$commit")
    [ "${#conditions[@]}" -eq 0 ] || rec+=(--conditions "${conditions[0]}")
  fi
  say "nemesis on the lab: seed $seed ${lab_args[*]:-} (history and report in $out)"
  status=0
  PALISADE_BIN_DIR="$bin_dir" "$bin_dir/palisade-nemesis" --seed "$seed" "${lab_args[@]}" "${rec[@]}" --out "$out" || status=$?
  [ "$record" = 0 ] || say "recorded in docs/data/campaigns.jsonl; docs/campaign-report.md regenerated"
  say "report: $out/report.txt"
  exit "$status"
fi
say "building palisade-sim (release)"
cargo build --release --quiet -p palisade-sim
say "simulating $schedules schedules from seed $seed ${bug[*]:-} ${joins[*]:-}"
report="target/chaos/sim-seed$seed.txt"
status=0
rec=()
if [ "$record" = 1 ]; then
  rec=(--record docs/data/simulation.jsonl --label "$(date -u +%F) $(git rev-parse --short HEAD)")
  say "running the planted controls"
  target/release/palisade-sim --controls "${rec[@]}" || status=$?
fi
target/release/palisade-sim --seed "$seed" --schedules "$schedules" "${bug[@]}" "${joins[@]}" "${rec[@]}" | tee "$report" || status=$?
if [ "$record" = 1 ]; then
  target/release/palisade-sim --report docs/data/simulation.jsonl > docs/simulation-report.md
  say "recorded in docs/data/simulation.jsonl; docs/simulation-report.md regenerated"
fi
say "report: $report"
exit "$status"
