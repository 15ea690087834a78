package main

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// sampleTenants is scenario 13 filled in by hand: its aims met in a full
// run, missed otherwise (a 429 among the flood's answers, the quiet
// tenant refused, the bounded client refused).
func sampleTenants(full bool) tenantsResult {
	ms := time.Millisecond
	load := func(codes map[uint16]int, p99 time.Duration) tenantLoad {
		var p point
		p.Statuses = map[string]int{}
		for code, n := range codes {
			for range n {
				p.Samples = append(p.Samples, sample{Code: code, Latency: p99, RetryAfter: code != http.StatusCreated})
			}
			p.Statuses[http.StatusText(int(code))] = n
		}
		return newTenantLoad(p)
	}
	r := tenantsResult{Capacity: 420, CapacityAt: 32, Factor: 5, Rate: 2100, For: 10 * time.Second, Quiet: "globex", QuietClients: 4, BoundedClients: 64,
		Limits:  "HTTP_MAX_IN_FLIGHT=32, HTTP_MAX_QUEUE=1024, HTTP_QUEUE_TIMEOUT=1s",
		Alone:   load(map[uint16]int{201: 1200}, 20*ms),
		Beside:  load(map[uint16]int{201: 800}, 35*ms),
		Flood:   load(map[uint16]int{201: 3000, 503: 18000}, 250*ms),
		Bounded: load(map[uint16]int{201: 4000}, 180*ms)}
	if !full {
		r.Flood = load(map[uint16]int{201: 3000, 503: 18000, 429: 5, 0: 2}, 250*ms)
		r.Beside = load(map[uint16]int{201: 700, 503: 50}, 90*ms)
		r.Bounded = load(map[uint16]int{201: 3000, 503: 100}, 400*ms)
	}
	return r
}

// The section's aims read the loads as issue 49 states them, and every
// heading and table header of its template is rendered.
func TestTheTenantsSectionJudgesItsAims(t *testing.T) {
	met, missed := sampleTenants(true), sampleTenants(false)
	if !met.QuietAnsweredMet() || !met.QuietP99Met() || !met.BoundedMet() {
		t.Errorf("the full sample meets every aim, the section says answered %v, p99 %v (%.2f×), bounded %v",
			met.QuietAnsweredMet(), met.QuietP99Met(), met.P99Ratio(), met.BoundedMet())
	}
	if missed.QuietAnsweredMet() || missed.QuietP99Met() || missed.BoundedMet() {
		t.Errorf("the partial sample misses every aim, the section says answered %v, p99 %v (%.2f×), bounded %v",
			missed.QuietAnsweredMet(), missed.QuietP99Met(), missed.P99Ratio(), missed.BoundedMet())
	}
	if l := missed.Flood; l.Answered != 3000 || l.Refused != 18000 || l.Quota != 5 || l.Other != 2 || l.Requests != 21007 {
		t.Errorf("the flood's load = %+v, want 3000 answered, 18000 refused 503, 5 refused 429, 2 others of 21007", l)
	}
	report, err := render(sampleRun(true), "throughput.svg")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(tenantsText, "\n")
	for i, line := range lines {
		heading := strings.HasPrefix(templateActions.ReplaceAllString(line, ""), "#")
		tableHeader := i+1 < len(lines) && strings.HasPrefix(templateActions.ReplaceAllString(lines[i+1], ""), "|-")
		if (heading || tableHeader) && !renderedFrom(line).MatchString(report) {
			t.Errorf("the report has no line rendered from %q", line)
		}
	}
}
