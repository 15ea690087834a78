package main

import (
	"testing"
	"time"
)

// Slices pool into one load: their requests summed, their throughput over
// their summed time (not the mean of their rates, which would weigh a
// short slice like a long one).
func TestSlicesPoolIntoOneLoad(t *testing.T) {
	a := point{Requests: 150, Throughput: 100, Drain: time.Second, Statuses: map[string]int{"201": 100, "503": 50},
		Samples: make([]sample, 150), CPU: cpuUse{Wall: time.Second, Postgres: 300 * time.Millisecond, OK: true}}
	b := point{Requests: 900, Throughput: 300, Drain: 3 * time.Second, Statuses: map[string]int{"201": 900},
		Samples: make([]sample, 900), CPU: cpuUse{Wall: 3 * time.Second, Postgres: time.Second, OK: true}}
	p := pool([]point{a, b})
	if p.Throughput != 250 || p.Requests != 1050 || p.Drain != 4*time.Second || len(p.Samples) != 1050 {
		t.Errorf("pooled: %.1f/s, %d requests in %s, %d samples; want 250/s, 1050 in 4s, 1050", p.Throughput, p.Requests, p.Drain, len(p.Samples))
	}
	if p.Statuses["201"] != 1000 || p.Statuses["503"] != 50 {
		t.Errorf("pooled statuses %v, want 201: 1000, 503: 50", p.Statuses)
	}
	if !p.CPU.OK || p.CPU.Wall != 4*time.Second || p.CPU.Postgres != 1300*time.Millisecond {
		t.Errorf("pooled CPU %+v, want 4s wall, 1.3s PostgreSQL", p.CPU)
	}
	b.CPU.OK = false
	if pool([]point{a, b}).CPU.OK {
		t.Error("a slice whose CPU could not be read left the pooled CPU usable")
	}
	if p := pool(nil); p.Throughput != 0 || p.CPU.OK {
		t.Errorf("no slices pooled into %+v", p)
	}
}
