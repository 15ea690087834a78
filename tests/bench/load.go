package main

import (
	"context"
	"crypto/sha256"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// shot is one vegeta attack: who is hit, how hard and for how long.
type shot struct {
	name     string
	client   *http.Client
	targeter vegeta.Targeter
	// workers > 0 is a closed loop: exactly that many requests in flight,
	// each worker sending its next request as soon as its last one returned.
	workers int
	// rate is the open-loop pace; the zero value is "as fast as the workers go".
	rate vegeta.Rate
	// duration bounds the attack; zero means until hits requests were sent.
	duration time.Duration
	// hits > 0 stops the attack after exactly that many requests.
	hits int
	// keepBody keeps response bodies, to check that replays are identical.
	keepBody bool
	// keepSamples keeps every request's time, latency and status.
	keepSamples bool
	// outcome, when set, names what each answer says (its body is read);
	// the point counts them in Outcomes.
	outcome func(*vegeta.Result) string
	// backends lists the PostgreSQL backends whose CPU time is measured.
	backends func() []int
	// service is the pid of the service's own process, when it runs in
	// one: its CPU counts with this process's.
	service int
}

// rate is an open loop's pace: perSecond requests a second.
func rate(perSecond int) vegeta.Rate { return vegeta.Rate{Freq: perSecond, Per: time.Second} }

// point is what one shot measured. Throughput, rate and status counts come
// from vegeta's Metrics; the latency quantiles are exact (sorted), not
// vegeta's t-digest estimates.
type point struct {
	Requests   uint64
	Throughput float64 // 2xx/3xx answers per second, first request sent to last answer received
	Rate       float64 // requests sent per second
	P50, P90   time.Duration
	P99, Max   time.Duration
	Drain      time.Duration // first request sent to last answer received
	Statuses   map[string]int
	Errors     []string
	Replayed   int              // answers carrying Idempotent-Replayed: true
	Bodies     map[[32]byte]int // SHA-256 of each distinct 2xx body (keepBody only)
	Outcomes   map[string]int   // answers by what the shot's outcome names them (outcome only)
	CPU        cpuUse
	Samples    []sample // keepSamples only, in the order the answers came
}

// sample is one request of a shot: when it was sent, how long it took,
// and its status (0: no answer, Timeout when the client gave up).
type sample struct {
	At      time.Time
	Latency time.Duration
	Code    uint16
	Timeout bool
	// RetryAfter is true when the answer carried a Retry-After header.
	RetryAfter bool
}

// ok counts the answers with status code.
func (p point) ok(code int) int { return p.Statuses[strconv.Itoa(code)] }

// fire runs the attack to its end (or until ctx ends) and summarises it.
func (s shot) fire(ctx context.Context) point {
	maxBody := int64(0) // read and discarded unless kept or looked at
	if s.keepBody || s.outcome != nil {
		maxBody = 1 << 20
	}
	opts := []func(*vegeta.Attacker){vegeta.Client(s.client), vegeta.MaxBody(maxBody)}
	if s.workers > 0 {
		opts = append(opts, vegeta.Workers(uint64(s.workers)), vegeta.MaxWorkers(uint64(s.workers)))
	}
	var pacer vegeta.Pacer = s.rate
	if s.hits > 0 {
		pacer = stopAfter{Pacer: s.rate, hits: uint64(s.hits)}
	}
	atk := vegeta.NewAttacker(opts...)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			atk.Stop()
		case <-done:
		}
	}()

	var m vegeta.Metrics
	var latencies []time.Duration
	p := point{}
	if s.keepBody {
		p.Bodies = map[[32]byte]int{}
	}
	if s.outcome != nil {
		p.Outcomes = map[string]int{}
	}
	var backends []int
	if s.backends != nil {
		backends = s.backends()
	}
	var also []int
	if s.service != 0 {
		also = []int{s.service}
	}
	before := readCPU(backends, also)
	for r := range atk.Attack(s.targeter, pacer, s.duration, s.name) {
		m.Add(r)
		latencies = append(latencies, r.Latency)
		if r.Headers.Get("Idempotent-Replayed") == "true" {
			p.Replayed++
		}
		if s.keepBody && r.Code >= 200 && r.Code < 300 {
			p.Bodies[sha256.Sum256(r.Body)]++
		}
		if s.outcome != nil {
			p.Outcomes[s.outcome(r)]++
		}
		if s.keepSamples {
			p.Samples = append(p.Samples, sample{At: r.Timestamp, Latency: r.Latency, Code: r.Code,
				Timeout:    r.Code == 0 && strings.Contains(r.Error, "Client.Timeout"),
				RetryAfter: r.Headers.Get("Retry-After") != ""})
		}
	}
	if s.backends != nil {
		backends = s.backends() // with any connection opened meanwhile
	}
	p.CPU = readCPU(backends, also).since(before)
	m.Close()

	p.Requests, p.Throughput, p.Rate = m.Requests, m.Throughput, m.Rate
	p.Drain, p.Statuses, p.Errors = m.End.Sub(m.Earliest), m.StatusCodes, m.Errors
	p.setLatencies(latencies)
	return p
}

// setLatencies sets p's latency quantiles from every request's latency.
func (p *point) setLatencies(latencies []time.Duration) {
	slices.Sort(latencies)
	p.P50, p.P90 = quantile(latencies, 0.50), quantile(latencies, 0.90)
	p.P99, p.Max = quantile(latencies, 0.99), quantile(latencies, 1)
}

// quantile is the nearest-rank q-quantile of sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// quantileHigh is an upper bound, at 95 % confidence, on the q quantile of
// the distribution the samples in sorted were drawn from. The r-th
// smallest sample lies at or above that quantile when fewer than r samples
// fell below it, that is when at least n-r+1 fell above it: a binomial
// count (n, 1-q). The bound is the r-th smallest for the smallest r whose
// chance is at least 95 %, summed exactly (no normal approximation: at
// q = 0.99 the count above is small and skewed). With too few samples for
// any bound at 95 % (fewer than 299 at q = 0.99: then even the largest is
// below the quantile more than 5 % of the time) it is the largest, and no
// bound: a quick run's figure, not a full one's.
func quantileHigh(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	p := 1 - q
	// below is P(count above < m), summed while it leaves 95 % for "at
	// least m above".
	pmf, below, m := math.Pow(1-p, float64(n)), 0.0, 0
	for m < n && below+pmf <= 0.05 {
		below += pmf
		pmf *= float64(n-m) / float64(m+1) * p / (1 - p)
		m++
	}
	return sorted[min(n-1, n-m)] // the (n-m+1)-th smallest
}

// stopAfter ends an attack once hits requests were sent: vegeta then fires
// exactly that many, however many workers are ready.
type stopAfter struct {
	vegeta.Pacer
	hits uint64
}

// Pace stops at the count, and otherwise paces as the wrapped pacer does.
func (p stopAfter) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if hits >= p.hits {
		return 0, true
	}
	return p.Pacer.Pace(elapsed, hits)
}
