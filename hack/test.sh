#!/usr/bin/env bash
# Runs every Palisade test on this machine: installs what is missing (Debian packages and
# the Kubernetes 1.34.4 and 1.20.2 control planes, cached), checks formatting and lints,
# builds, and runs the whole suite against the real parts (control plane, ipmi_sim, snmpd,
# namespaces). The suite runs on Kubernetes 1.34 (the lab's default); the compatibility set
# below runs again on 1.20, the oldest release Palisade supports.
# Needs root: the lab creates network and PID namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# Each line says when it was printed (seconds since the start), to see where a run's time went.
say() { printf '[test] %s (at %d s)\n' "$*" "$SECONDS"; }
# A clean run gains nothing from incremental caches, and they doubled the target directory
# (a CI run once filled the disk): build without them, and say how much disk the build uses.
export CARGO_INCREMENTAL=0

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/test.sh must run as root: the lab creates network and PID namespaces" >&2
  exit 1
fi

say "installing dependencies"
bash hack/install-deps.sh

say "the README and the book: links, table of contents, length"
bash hack/check-docs.sh

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

say "cargo doc -D warnings (broken intra-doc links fail the suite)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

say "building binaries and tests"
cargo build --workspace --bins --tests --quiet
# The benchmark binaries live behind features: build them too, so they cannot rot.
cargo build --quiet -p palisade-fence --features bench --bins
cargo build --quiet -p palisade-bridge --features bench --bins
say "disk: target $(du -sh target 2>/dev/null | cut -f1), free $(df -h --output=avail . | tail -1 | tr -d ' ')"

# Each lab test brings up its own lab (several run side by side); two at a time suits 2 cores.
# The node agent's and the controller's end-to-end scenarios run one test at a time per lane
# (their timing checks allow for the machine's measured timer lateness with one other lab
# beside them, not for an idle machine), in two lanes side by side: lane 1 the node agent's
# package, then the controller's longest binaries; lane 2 the rest of the controller's, then
# the compatibility set. Lane 2 ended 24 minutes after lane 1 on 2026-12-02 (an 84-minute
# run), so the QEMU binaries (about 8 minutes) moved to lane 1, where they still run one
# at a time (no two QEMU labs at once on 2 cores). On 2026-12-03 (a 77-minute run) lane 2
# with the compatibility set still took 31 minutes to lane 1's 22, so redfish_quirks,
# guard_holds and watch_lag (about 5 minutes) moved to lane 1 too.
threads="${PALISADE_TEST_THREADS:-2}"
node_pkg=palisade-e2e-node
ctl_pkg=palisade-e2e-controller
ctl_long=(in_cluster controller_crash demo redfish_quirks guard_holds watch_lag
  qemu_companion qemu_flap qemu_identity qemu_reset qemu_watchdog)
ctl_rest=()
for f in tests/e2e-controller/tests/*.rs; do
  t=$(basename "$f" .rs)
  case " ${ctl_long[*]} " in *" $t "*) ;; *) ctl_rest+=("$t") ;; esac
done
for t in "${ctl_long[@]}"; do
  [ -f "tests/e2e-controller/tests/$t.rs" ] || { echo "hack/test.sh: no test binary $t in $ctl_pkg" >&2; exit 1; }
done
long_args=()
for t in "${ctl_long[@]}"; do long_args+=(--test "$t"); done
rest_args=(--lib)
for t in "${ctl_rest[@]}"; do rest_args+=(--test "$t"); done
# The compatibility set on Kubernetes 1.20: the lab's control plane, PDBs (policy/v1beta1),
# the CRDs without CEL and the webhook alone at the door, Events, the release and its taints
# (no out-of-service handling by Kubernetes), recovery and the untaint, and cross-field
# mistakes reported by the controller (no CEL at the door), and the install's user roles and
# PodDisruptionBudget (policy/v1beta1 through the overlay), and the Helm chart (its PDB by the
# server's version; server-side apply).
compat_ctl=(headline release_scope guard_timing admission config_status identity recovery user_roles helm)
compat_args=()
for t in "${compat_ctl[@]}"; do
  [ -f "tests/e2e-controller/tests/$t.rs" ] || { echo "hack/test.sh: no test binary $t in $ctl_pkg" >&2; exit 1; }
  compat_args+=(--test "$t")
done
status=0
mkdir -p target
log=target/test-suite.log
: > "$log"
# The attach-detach negative control waits out Kubernetes 1.20's 6-minute force detach, mostly
# idle: it runs in the background, beside the rest of the suite.
slow=force_deleted_writer_on_a_partitioned_machine_is_split_brain_unless_storage_fenced
say "starting $slow in the background (about 7 minutes)"
cargo test -p palisade-labstore --test lab_statefulset > target/lab_statefulset.log 2>&1 &
slow_pid=$!
say "running the suite (${threads} test threads per binary)"
cargo test --workspace --exclude "$node_pkg" --exclude "$ctl_pkg" --no-fail-fast \
  -- --test-threads="$threads" --skip "$slow" 2>&1 | tee -a "$log" || status=$?
# Built one package at a time first: `-p` resolves features per package, so each may rebuild
# a few crates, and the lanes below must not rebuild while the other runs.
for p in "$node_pkg" "$ctl_pkg"; do
  cargo test -p "$p" --no-run --quiet || status=$?
done
lane1_log=target/e2e-lane1.log
say "lane 1 in the background: $node_pkg, then $ctl_pkg ${ctl_long[*]} (one test at a time)"
(
  lane_status=0
  cargo test -p "$node_pkg" --no-fail-fast -- --test-threads=1 || lane_status=$?
  cargo test -p "$ctl_pkg" "${long_args[@]}" --no-fail-fast -- --test-threads=1 || lane_status=$?
  exit "$lane_status"
) > "$lane1_log" 2>&1 &
lane1_pid=$!
say "lane 2: $ctl_pkg, the other ${#ctl_rest[@]} binaries (one test at a time)"
cargo test -p "$ctl_pkg" "${rest_args[@]}" --no-fail-fast -- --test-threads=1 2>&1 | tee -a "$log" || status=$?
say "lane 2: the compatibility set on Kubernetes 1.20: lab control_plane, $ctl_pkg ${compat_ctl[*]}"
PALISADE_KUBE=1.20 cargo test -p palisade-lab --test control_plane --no-fail-fast 2>&1 | tee -a "$log" || status=$?
PALISADE_KUBE=1.20 cargo test -p "$ctl_pkg" "${compat_args[@]}" --no-fail-fast -- --test-threads=1 2>&1 | tee -a "$log" || status=$?
lane1_status=0
wait "$lane1_pid" || lane1_status=$?
say "$lane1_log (lane 1, background):"
cat "$lane1_log" | tee -a "$log"
[ "$lane1_status" -eq 0 ] || status=$lane1_status
slow_status=0
wait "$slow_pid" || slow_status=$?
say "$slow (background):"
cat target/lab_statefulset.log
[ "$slow_status" -eq 0 ] || status=$slow_status
# Where the time went, for keeping the suite near an hour: the slowest test binaries (each
# binary's wall time; the lanes overlap, so these do not add up to the run).
say "the slowest test binaries (seconds):"
awk '/^     Running / { bin = $2 } /^test result: .* finished in / {
       t = $NF; sub(/s$/, "", t); if (bin != "") printf "%8.1f  %s\n", t, bin; bin = "" }' \
  "$log" target/lab_statefulset.log | sort -rn | head -n 12 || true
say "took $SECONDS s in all"
if [ "$status" -ne 0 ]; then
  # CI keeps only the tail of the output: name what failed last, where it stays visible.
  # Why, first: the first lines of each panic's message, cut short (a message may quote a
  # whole demo's output).
  say "why (the first lines of each panic's message):"
  awk '/panicked at/ { n = 3; print; next } n > 0 { n--; print substr($0, 1, 300) }' \
    "$log" target/lab_statefulset.log | head -n 40 || true
  say "failures (from $log and target/lab_statefulset.log):"
  grep -hE '^test .* \.\.\. FAILED$|panicked at|^error: test failed|^     Running ' "$log" target/lab_statefulset.log \
    | grep -B1 -E 'FAILED|panicked|error: test failed' | grep -v '^--$' || true
  say "FAILED"
  exit "$status"
fi
say "all tests passed"
