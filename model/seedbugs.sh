#!/usr/bin/env bash
# make seedbugs: shows that the trace check catches real mistakes. Each bug
# below is seeded into a temporary copy of the tree (the working tree is
# never touched), and in that copy the Go tests of internal/order,
# internal/idempotency and internal/payment run with their runs recorded;
# tools/tracecheck then replays the runs of the traced tests
# (model/traced_tests) against the unchanged model. The table says, for
# each bug, whether the traces were rejected (and the first event no path
# explains) and which Go tests failed. SEEDBUGS=name,... runs only those.
# Takes a few minutes a bug; not run in CI.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
traced="^($(grep -v '^#' "$repo/model/traced_tests" | paste -sd'|'))\$"
filter="^($(grep -v '^#' "$repo/model/traced_tests" | paste -sd'|'))(__.*)?\.jsonl\$"

# seed NAME FILE: replaces, in FILE of the copy, the text between the
# markers OLD and NEW read from stdin; fails if OLD is not there once.
seed() {
	python3 -c '
import sys
tree, path = sys.argv[1], sys.argv[2]
old, new = sys.stdin.read().split("\n=>\n")
p = tree + "/" + path
s = open(p).read()
if s.count(old) != 1:
    sys.exit("seedbugs: the text to replace is not in %s once" % path)
open(p, "w").write(s.replace(old, new))
' "$1" "$2"
}

# bug NAME: seeds NAME into the tree $1.
bug() {
	local tree=$2
	case $1 in
	fail-unfenced) # Fail without the fence: a superseded owner's postpone lands
		seed "$tree" internal/idempotency/store.go <<'X'
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state = 'PROCESSING'`,
		retryAfter.Seconds(), scope.TenantID, scope.Operation, scope.Key, token)
=>
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`,
		retryAfter.Seconds(), scope.TenantID, scope.Operation, scope.Key)
X
		;;
	gateway-404) # a lookup's 404 from a gateway taken as "nothing under the key"
		seed "$tree" internal/payment/client.go <<'X'
	case e.Lookup && e.StatusCode == http.StatusNotFound && (e.Code == CodeChargeNotFound || e.Code == CodeRefundNotFound):
=>
	case e.Lookup && e.StatusCode == http.StatusNotFound:
X
		;;
	transient-final) # a 503 (no verdict) stored as the intent's final answer
		seed "$tree" internal/order/once.go <<'X'
	if reply.verdict == unknown {
		return idempotency.Result{}, s.postpone(ctx, rec, s.askAgainAfter(rec, reply))
	}
=>
	if reply.verdict == unknown {
		res := idempotency.Failed(p.OrderID.String(), &problem.Error{Code: problem.ServiceUnavailable, Detail: "no verdict"})
		return res, database.Transact(ctx, s.DB, func(tx *gorm.DB) error { return s.Records.Complete(tx, rec.Scope(), rec.LeaseToken, res) })
	}
X
		;;
	cleanup-inflight) # the cleanup removes expired records in any state
		seed "$tree" internal/idempotency/cleanup.go <<'X'
				WHERE state IN ('SUCCEEDED', 'FAILED_FINAL') AND expires_at < now()
=>
				WHERE expires_at < now()
X
		;;
	timeout-declines) # no answer from the channel taken as a decline
		seed "$tree" internal/order/payment_intent.go <<'X'
		s.logger().WarnContext(ctx, "payment channel gave no definitive reply", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: unknown}, nil
=>
		s.logger().WarnContext(ctx, "payment channel gave no definitive reply", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: declined}, nil
X
		;;
	send-after-window) # the key sent again whatever the key window (no judgement at the call)
		seed "$tree" internal/order/keywindow.go <<'X'
	if how == send && !s.keyRemembered(p, deadline.Add(KeyWindowMargin)) {
=>
	if how == send && false && !s.keyRemembered(p, deadline.Add(KeyWindowMargin)) {
X
		;;
	point-not-advanced) # phase 1 writes the payment but leaves the recovery point at started
		seed "$tree" internal/order/once.go <<'X'
			return s.Records.Advance(tx, in.Scope, claim.Token(), paymentCreated)
=>
			return nil
X
		;;
	refund-pending-done) # a refund the channel took on (pending) counted as done
		seed "$tree" internal/order/reply.go <<'X'
	r := channelReply{verdict: unknown, ref: rf.ID, reason: rf.Status, replayed: replayed, answered: true}
	switch rf.Status {
	case payment.StatusSucceeded:
=>
	r := channelReply{verdict: unknown, ref: rf.ID, reason: rf.Status, replayed: replayed, answered: true}
	switch rf.Status {
	case payment.StatusSucceeded, payment.StatusPending:
X
		;;
	*) echo "seedbugs: no bug $1"; exit 2 ;;
	esac
}
bugs="fail-unfenced gateway-404 transient-final cleanup-inflight timeout-declines send-after-window point-not-advanced refund-pending-done"
[ -n "${SEEDBUGS:-}" ] && bugs=${SEEDBUGS//,/ }

# tracecheck, built once; it compiles the unchanged model's verifiers for
# each bug's traces.
(cd "$repo" && go build -o "$work/tracecheck" ./tools/tracecheck)
table="$work/table"
printf '%-18s | %-70s | %s\n' "bug" "traces (tracecheck)" "Go tests that failed" >"$table"
start=$(date +%s)
for b in $bugs; do
	tree=$work/tree-$b
	mkdir -p "$tree"
	(cd "$repo" && git ls-files -z | xargs -0 cp --parents -t "$tree")
	bug "$b" "$tree"
	traces=$work/traces-$b
	mkdir -p "$traces"
	echo "== $b: the Go tests, recording"
	(cd "$tree" && ORDERSERVICE_TRACE_DIR=$traces go test -count=1 -timeout 10m \
		./internal/order/ ./internal/idempotency/ ./internal/payment/... >"$work/$b.tests" 2>&1) || true
	failing=$(grep -oE '^--- FAIL: Test[A-Za-z0-9_]+' "$work/$b.tests" | sed 's/--- FAIL: //' | sort -u | paste -sd' ' || true)
	# A failing test's output may say "cannot" (a subtest is named so): a
	# build failure is what go test marks as one.
	if grep -qE '^(FAIL|ok)\s' "$work/$b.tests" && ! grep -qE '\[(build|setup) failed\]' "$work/$b.tests"; then :; else
		echo "seedbugs: $b did not build:"; cat "$work/$b.tests"; exit 1
	fi
	mkdir -p "$traces/traced"
	find "$traces" -maxdepth 1 -name '*.jsonl' -printf '%f\n' | grep -E "$filter" | while read -r f; do mv "$traces/$f" "$traces/traced/"; done
	echo "== $b: the traces"
	if (cd "$repo" && "$work/tracecheck" -model model/idempotency.pml -jobs "${MODEL_JOBS:-2}" "$traces/traced") >"$work/$b.check" 2>&1; then
		verdict="explained: not caught"
	else
		verdict="REJECTED: $(grep -c 'NOT EXPLAINED' "$work/$b.check") traces; first: $(grep -m1 'NOT EXPLAINED' "$work/$b.check" | sed -E 's/.*cannot explain event [0-9]+ of [0-9]+: ([a-z_]+\[[0-9 ]+\]).*/\1/')"
	fi
	tail -1 "$work/$b.check"
	grep -m3 'NOT EXPLAINED' "$work/$b.check" | cut -c1-400 || true
	printf '%-18s | %-70s | %s\n' "$b" "$verdict" "${failing:-none}" >>"$table"
	rm -rf "$tree"
done
echo
cat "$table"
echo "seeded bugs checked in $(( $(date +%s) - start ))s"
