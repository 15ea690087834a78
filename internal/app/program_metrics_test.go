package app_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/orderservice/orderservice/tests/apptest"
)

// A labelled series a dashboard or an alert names exists from the start at
// zero, before anything happened that it counts: a rate over a missing
// series is no rate at all.
func TestLabelledMetricsAreExportedAtZeroFromTheStart(t *testing.T) {
	isolateMoney(t)
	m := apptest.Start(t, dbURL, nil)
	r := apptest.NewClient(m, apptest.KeyAcme).Do(t, http.MethodGet, "/metrics", "", nil)
	for _, series := range []string{
		`orderservice_payment_channel_duplicates_absorbed_total{kind="charge"} 0`,
		`orderservice_payment_channel_duplicates_absorbed_total{kind="refund"} 0`,
		`orderservice_payment_channel_call_duration_seconds_count{kind="charge",outcome="rejected"} 0`,
		`orderservice_idempotency_key_conflicts_total{operation="order.create"} 0`,
		`orderservice_idempotency_takeovers_total{by="sweeper",operation="order.pay"} 0`,
		`orderservice_idempotent_requests_total{operation="order.cancel",outcome="replayed"} 0`,
		`orderservice_idempotency_records_cleaned_total{action="archived"} 0`,
		`orderservice_idempotency_waits_total{ended="looked"} 0`,
	} {
		if !strings.Contains(string(r.Body), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
