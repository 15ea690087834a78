package metrics

import (
	"io"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// waitsName is the counter of how waits for a first result ended.
const waitsName = "orderservice_idempotency_waits_total"

// WaitsEnded reads from a /metrics page how many waits for a first result
// have ended each way, for those who watch a service from outside (the lab,
// the benchmark, tests).
func WaitsEnded(page io.Reader) (map[idempotency.Wake]int, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(page)
	if err != nil {
		return nil, err
	}
	ended := map[idempotency.Wake]int{}
	for _, m := range families[waitsName].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "ended" {
				ended[idempotency.Wake(l.GetValue())] = int(m.GetCounter().GetValue())
			}
		}
	}
	return ended, nil
}
