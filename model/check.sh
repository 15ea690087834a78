#!/usr/bin/env bash
# make model: checks model/idempotency.pml with SPIN. The protocol must hold
# over every interleaving, in each of its four configurations; each variant (one
# safeguard removed) must fail, and SPIN's shortest counterexample for it
# is reported with the harm it shows. Runs go side by side on MODEL_JOBS
# cores (default: all). MODEL_TRAILS=dir writes the trails; MODEL_ALL=1
# also checks NO_TOKEN, which must hold (half a minute more), and liveness
# with two faults in each configuration (about 3 minutes and 3 GB each,
# so not in CI).
#
# Then the code is checked against the model (trace validation): the
# order tests named in traced_tests run with ORDERSERVICE_TRACE_DIR set and record
# their runs, and tools/tracecheck replays each against the model; a run no
# path of the model explains fails the target, naming its first unexplained
# event. The tests need the PostgreSQL make test uses. MODEL_TRACES=dir
# checks the runs recorded in dir instead of recording them; MODEL_TRACES=no
# skips the trace check.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd .. && pwd)
TRACED_TESTS=${TRACED_TESTS:-"^($(grep -v '^#' traced_tests | paste -sd'|'))\$"}
if ! command -v spin >/dev/null; then
	echo "spin is missing: installing Debian's package"
	apt-get update -qq && apt-get install -y -qq spin >/dev/null
fi
model=$(pwd)/idempotency.pml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
jobs_max=${MODEL_JOBS:-$(nproc)}

# verify NAME "SPIN -D flags" "cc flags" "pan flags": builds and runs one
# verifier in the directory NAME, its output in NAME/out. MEMLIM stops a
# run that grows past 4 GB (memlim=MB: another bound) instead of the machine.
verify() {
	mkdir -p "$1" && cp "$model" "$1/"
	(
		cd "$1"
		spin -a $2 idempotency.pml >/dev/null
		cc -O2 -DMEMLIM=${memlim:-4096} $3 -o pan pan.c
		./pan -m100000 $4 >out 2>&1 || true
		rm -f pan
	)
}
stat() { grep -E "$2" "$1/out" | head -1 | sed 's/^ *//'; }
states() { grep -oE '^ *[0-9]+ states, stored' "$1/out" | head -1 | sed 's/^ *//'; }
holds() { grep -q "errors: 0" "$1/out" 2>/dev/null; }
ran() { grep -q "errors: [0-9]" "$1/out" 2>/dev/null; }
# harm NAME SPINFLAGS: what NAME's trail shows, as the comment on the
# assertion it violates says it.
harm() {
	local line
	line=$(cd "$1" && spin -t $2 idempotency.pml 2>&1 | grep -oE 'idempotency\.pml:[0-9]+, Error' | head -1 | grep -oE '[0-9]+' || true)
	if [ -n "$line" ]; then
		sed -n "${line}p" "$1/idempotency.pml" | sed -E 's@.*/\* *@@; s@ *\*/.*@@'
	else
		grep -m1 -oE 'assertion violated .*\(at' "$1/out" | sed 's/ (at$//'
	fi
}
# spawn CMD...: runs CMD in the background once a core is free.
spawn() {
	while [ "$(jobs -rp | grep -vxc "${recording:-none}")" -ge "$jobs_max" ]; do wait -n || true; done
	"$@" &
}
failed=0
start=$(date +%s)

# The traced tests record while the verifiers run: they mostly wait on
# the database.
traces=${MODEL_TRACES:-}
if [ -z "$traces" ]; then
	traces=$work/traces
	mkdir -p "$traces"
	(cd "$repo" && ORDERSERVICE_TRACE_DIR=$traces go test -count=1 -timeout 5m -run "$TRACED_TESTS" ./internal/order/ >"$work/traced-tests.out" 2>&1; echo $? >"$work/traced-tests.rc") &
	recording=$!
fi

# The protocol holds: every configuration, safety with two faults,
# liveness under weak fairness with one.
configs="replays order refund second"
cfgflag() { case $1 in order) echo -DORDER ;; refund) echo -DREFUND ;; second) echo "-DORDER -DSECOND" ;; esac; }
for cfg in $configs; do
	d=$(cfgflag $cfg)
	spawn verify "$cfg" "$d" "-DSAFETY -DNOCLAIM" ""
	spawn verify "live_$cfg" "$d -DLIVENESS -DFAULTS=1" "-DNFAIR=4" "-a -f -N converges"
done

# Each safeguard removed: SPIN must find the harm. -i looks for the shortest
# trail. Each runs in the configuration that has what it needs.
variants="order:NO_FENCING order:CHECK_THEN_INSERT order:NEW_KEY replays:SHORT_RETENTION
	order:NO_LOOKUP order:AGE_ONLY order:LOOKUP_FORGETS replays:CLEANUP_INFLIGHT
	order:TIMEOUT_DECLINES order:FAILED_LOOKUP_DECLINES order:CANCEL_WHILE_PENDING
	order:FAIL_UNFENCED order:TRANSIENT_FINAL order:DECIDE_AT_CLAIM
	refund:NEW_KEY refund:NO_LOOKUP refund:SHIP_WHILE_REFUNDING refund:PENDING_REFUND_DONE
	second:PAY_WHILE_PENDING"
flags() { echo "$(cfgflag "${1%%:*}") -D${1#*:}"; }
vdir() { echo "${1%%:*}_${1#*:}"; }
for spec in $variants; do
	spawn verify "$(vdir "$spec")" "$(flags "$spec")" "-DSAFETY -DNOCLAIM" "-i"
done
spawn verify NO_SWEEPER "-DFAULTS=1 -DLIVENESS -DNO_SWEEPER" "-DNFAIR=4" "-a -f -N converges"
if [ -n "${MODEL_ALL:-}" ]; then
	for cfg in $configs; do
		d=$(cfgflag $cfg)
		spawn verify "NO_TOKEN_$cfg" "$d -DNO_TOKEN" "-DSAFETY -DNOCLAIM" ""
		memlim=8192 spawn verify "live2_$cfg" "$d -DLIVENESS -DFAULTS=2" "-DNFAIR=4 -DCOLLAPSE" "-a -f -N converges"
	done
fi
wait

for cfg in $configs; do
	echo "protocol ($cfg), safety (FAULTS=2): $(stat $cfg 'errors:'); $(states $cfg); $(stat $cfg 'elapsed time'); $(stat $cfg 'total actual memory')"
	if ! holds $cfg; then cat $cfg/out; failed=1; fi
	echo "protocol ($cfg), converges under weak fairness (FAULTS=1): $(stat live_$cfg 'errors:'); $(states live_$cfg); $(stat live_$cfg 'elapsed time'); $(stat live_$cfg 'total actual memory')"
	if ! holds live_$cfg; then cat live_$cfg/out; failed=1; fi
done
for spec in $variants; do
	v=$(vdir "$spec") d=$(flags "$spec") name="${spec#*:} (${spec%%:*})"
	if ! ran "$v"; then
		echo "$name: the verifier did not run"; cat "$v/out" 2>/dev/null || true
		failed=1
		continue
	fi
	if holds "$v"; then
		echo "$name: SPIN found no counterexample; the model no longer shows why this safeguard is needed"
		failed=1
		continue
	fi
	steps=$(cd "$v" && spin -t $d idempotency.pml 2>&1 | grep -oE 'trail ends after [0-9]+ steps' | grep -oE '[0-9]+' || true)
	echo "$name: $(harm "$v" "$d") -- shortest counterexample: ${steps:-?} steps ($(states "$v") in the search)"
	if [ -n "${MODEL_TRAILS:-}" ]; then
		(cd "$v" && spin -t -p -g $d idempotency.pml) >"$MODEL_TRAILS/$v.trail.txt" 2>&1 || true
	fi
done
if ! ran NO_SWEEPER; then
	echo "NO_SWEEPER: the verifier did not run"; failed=1
elif holds NO_SWEEPER; then
	echo "NO_SWEEPER: no stuck intent found; the liveness property would be vacuous"
	failed=1
else
	echo "NO_SWEEPER (replays): $(stat NO_SWEEPER 'acceptance cycle') -- an intent stays unfinished"
fi
if [ -n "${MODEL_ALL:-}" ]; then
	for cfg in $configs; do
		echo "NO_TOKEN ($cfg), must hold: $(stat NO_TOKEN_$cfg 'errors:'); $(states NO_TOKEN_$cfg)"
		if ! holds NO_TOKEN_$cfg; then failed=1; fi
		echo "protocol ($cfg), converges under weak fairness (FAULTS=2): $(stat live2_$cfg 'errors:'); $(states live2_$cfg); $(stat live2_$cfg 'elapsed time'); $(stat live2_$cfg 'total actual memory')"
		if ! holds live2_$cfg; then cat live2_$cfg/out; failed=1; fi
	done
fi
echo "model checked in $(( $(date +%s) - start ))s"

if [ "$traces" != no ]; then
	if [ -n "${recording:-}" ]; then
		wait "$recording" 2>/dev/null || true
		if [ "$(cat "$work/traced-tests.rc")" != 0 ]; then
			echo "the traced tests failed:"; cat "$work/traced-tests.out"; exit 1
		fi
	fi
	tstart=$(date +%s)
	if ! (cd "$repo" && go run ./tools/tracecheck -model model/idempotency.pml -jobs "$jobs_max" "$traces"); then
		failed=1
	fi
	echo "traces checked in $(( $(date +%s) - tstart ))s; everything in $(( $(date +%s) - start ))s"
fi
exit $failed
