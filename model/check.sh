#!/usr/bin/env bash
# make model: checks model/idempotency.pml with SPIN. The protocol must hold
# over every interleaving; each variant (one safeguard removed) must fail,
# and SPIN's shortest counterexample for it is reported.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v spin >/dev/null; then
	echo "spin is missing: installing Debian's package"
	apt-get update -qq && apt-get install -y -qq spin >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp idempotency.pml "$work/"
cd "$work"

# verify NAME "SPIN -D flags" "cc flags" "pan flags": builds and runs one verifier.
verify() {
	spin -a $2 idempotency.pml >/dev/null
	cc -O2 $3 -o "pan_$1" pan.c
	./"pan_$1" -m100000 $4 >"$1.out" 2>&1 || true
}
stat() { grep -E "$2" "$1.out" | head -1 | sed 's/^ *//'; }
failed=0

start=$(date +%s)
verify safety "" "-DSAFETY -DNOCLAIM" ""
echo "protocol, safety (FAULTS=2): $(stat safety 'errors:'); $(stat safety 'states, stored'); $(stat safety 'elapsed time')"
if ! grep -q "errors: 0" safety.out; then cat safety.out; failed=1; fi

verify liveness "-DFAULTS=1" "-DNFAIR=4" "-a -f -N ends_definitive"
echo "protocol, ends definitive under weak fairness (FAULTS=1): $(stat liveness 'errors:'); $(stat liveness 'states, stored'); $(stat liveness 'elapsed time')"
if ! grep -q "errors: 0" liveness.out; then cat liveness.out; failed=1; fi

# Each safeguard removed: SPIN must find the harm. -i looks for the shortest trail.
for v in NO_FENCING CHECK_THEN_INSERT NEW_KEY SHORT_RETENTION NO_LOOKUP; do
	verify "$v" "-D$v" "-DSAFETY -DNOCLAIM" "-i"
	if grep -q "errors: 0" "$v.out"; then
		echo "$v: SPIN found no counterexample; the model no longer shows why this safeguard is needed"
		failed=1
	else
		steps=$(spin -t -D"$v" idempotency.pml 2>&1 | grep -oE 'trail ends after [0-9]+ steps' || true)
		echo "$v: $(grep -m1 -oE 'assertion violated .*\(at' "$v.out" | sed 's/ (at$//') -- shortest counterexample: $steps"
		if [ -n "${MODEL_TRAILS:-}" ]; then
			spin -t -p -g -D"$v" idempotency.pml >"$MODEL_TRAILS/$v.trail.txt" 2>&1 || true
		fi
	fi
done
verify NO_SWEEPER "-DFAULTS=1 -DNO_SWEEPER" "-DNFAIR=4" "-a -f -N ends_definitive"
if grep -q "errors: 0" NO_SWEEPER.out; then
	echo "NO_SWEEPER: no stuck intent found; the liveness property would be vacuous"
	failed=1
else
	echo "NO_SWEEPER: $(stat NO_SWEEPER 'acceptance cycle') -- an intent stays unfinished"
fi
echo "model checked in $(( $(date +%s) - start ))s"
exit $failed
