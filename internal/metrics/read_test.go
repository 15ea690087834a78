package metrics_test

import (
	"context"
	"log/slog"
	"maps"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
)

// What Waited counts, WaitsEnded reads back from the page the service
// serves: every way a wait can end, at zero until it happens.
func TestTheWaitsCountedAreReadBackFromTheMetricsPage(t *testing.T) {
	m := metrics.New(func(context.Context) (idempotency.Gauges, error) { return idempotency.Gauges{}, nil },
		slog.New(slog.DiscardHandler), []string{"order.pay"}, []string{"order.pay"})
	read := func() map[idempotency.Wake]int {
		t.Helper()
		page := httptest.NewRecorder()
		m.Handler().ServeHTTP(page, httptest.NewRequest("GET", "/metrics", nil))
		ended, err := metrics.WaitsEnded(strings.NewReader(page.Body.String()))
		if err != nil {
			t.Fatal(err)
		}
		return ended
	}

	want := map[idempotency.Wake]int{}
	for _, how := range idempotency.Wakes {
		want[how] = 0
	}
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("before any wait: %v, want %v", got, want)
	}
	m.Waited(idempotency.Notified)
	m.Waited(idempotency.Notified)
	m.Waited(idempotency.Looked)
	want[idempotency.Notified], want[idempotency.Looked] = 2, 1
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("after three waits: %v, want %v", got, want)
	}
	if _, err := metrics.WaitsEnded(strings.NewReader("not a metrics page {")); err == nil {
		t.Error("a page that is not the text format was read without an error")
	}
}
