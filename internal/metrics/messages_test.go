package metrics_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
)

// Every counter of the message door is on the page from the start, at
// zero for each op, so an alert or a rate() over it has a series before
// the first command: the dead letters given up (which
// OrderserviceDeadLetterGivenUp watches) and the postponements included.
func TestEveryMessageCounterIsOnThePageFromTheStart(t *testing.T) {
	m := metrics.New(func(context.Context) (idempotency.Gauges, error) { return idempotency.Gauges{}, nil },
		slog.New(slog.DiscardHandler), []string{"order.pay"}, []string{"order.pay"})
	page := httptest.NewRecorder()
	m.Handler().ServeHTTP(page, httptest.NewRequest("GET", "/metrics", nil))
	for _, name := range []string{"received", "acked", "redelivered", "dead_lettered", "dead_letters_given_up", "replayed", "postponed", "handed_back"} {
		for _, op := range []string{"create", "pay", "cancel", "ship", "deliver", "unknown"} {
			series := "orderservice_messages_" + name + `_total{op="` + op + `"} 0`
			if !strings.Contains(page.Body.String(), series) {
				t.Errorf("the metrics page has no %s", series)
			}
		}
	}
}
