package lessons

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// capacity are the lessons of the fourth round: the service's capacity,
// scoped by tenant as its keys are. They follow the pitfalls.
func capacity() []Lesson {
	return []Lesson{{
		Title: "A tenant floods; its neighbour keeps its answers",
		Why: "The seed scopes every key by tenant so that callers cannot collide, and capacity must be scoped the same " +
			"way: a service that serves whoever sends most lets one tenant's batch job, retry storm or slow connections " +
			"take every slot, and the quiet tenant beside it is refused for what it did not do. Here the slots go to " +
			"tenants in turn, weighted, a tenant within its share always waits its turn, and only the one that sends " +
			"more than its share waits for or is refused its own requests (503 + Retry-After before anything is " +
			"recorded). A tenant over its own quota gets 429; both answers say in RateLimit fields what is left.",
		run: floodBesideAQuietTenant,
	}}
}

// floodClients is how many clients the flooding tenant runs: four times the
// service's default slots (HTTP_MAX_IN_FLIGHT 32).
const floodClients = 128

// loopFigures counts one tenant's answers during a closed loop.
type loopFigures struct {
	answered, refused, other atomic.Int64
	mu                       sync.Mutex
	latencies                []time.Duration
}

func (f *loopFigures) String() string {
	return fmt.Sprintf("%d answered, %d refused", f.answered.Load(), f.refused.Load())
}

// p99 is the 99th percentile of the answered requests' latencies.
func (f *loopFigures) p99() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.latencies) == 0 {
		return 0
	}
	l := slices.Clone(f.latencies)
	slices.Sort(l)
	return l[min(len(l)-1, len(l)*99/100)]
}

// floodAtMost is how many seconds the flood lasts at most, waiting for
// the quiet tenant's answers on a slow machine.
const floodAtMost = 60

// closeAfter returns a channel closed once d has passed.
func closeAfter(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	time.AfterFunc(d, func() { close(c) })
	return c
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// closedLoop runs clients of the tenant with apiKey, each creating an
// order as soon as its last was answered (and waiting Retry-After when
// refused), until stop is closed: a request in flight then is still
// answered and counted (ctx, the lesson's, cancels it only if the lesson
// ends). Its requests are not the lesson's story: they go through a
// client of their own, not on the timeline.
func (s *Session) closedLoop(ctx context.Context, stop <-chan struct{}, hc *http.Client, apiKey string, clients int, f *loopFigures) {
	body := fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unit_price":100}]}`, s.customer())
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil && !closed(stop); n++ {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.BaseURL+"/v1/orders", strings.NewReader(body))
				if err != nil {
					return
				}
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%s-%d-%d", s.keyPrefix, apiKey[len(apiKey)-4:], i, n))
				start := time.Now()
				a, err := s.do(hc, req)
				switch {
				case err != nil:
					if ctx.Err() == nil {
						f.other.Add(1)
					}
				case a.status == http.StatusCreated:
					f.answered.Add(1)
					f.mu.Lock()
					f.latencies = append(f.latencies, time.Since(start))
					f.mu.Unlock()
				case a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests:
					f.refused.Add(1)
					after, _ := strconv.Atoi(a.header.Get("Retry-After"))
					select {
					case <-time.After(time.Duration(after) * time.Second):
					case <-stop:
					case <-ctx.Done():
					}
				default:
					f.other.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// 22. A flood beside a quiet tenant.
func floodBesideAQuietTenant(ctx context.Context, s *Session) error {
	quiet, quietKey := s.cfg.NeighbourTenant, s.cfg.NeighbourAPIKey
	if quietKey == "" {
		return fmt.Errorf("this lesson needs a second tenant's API key (pass -neighbour-api-key)")
	}
	loud := s.cfg.Tenant
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: floodClients + 8}}
	defer hc.CloseIdleConnections()

	s.send("%s alone: 4 clients create orders for 1s, each sending its next when its last is answered", quiet)
	alone := &loopFigures{}
	s.closedLoop(ctx, closeAfter(time.Second), hc, quietKey, 4, alone)
	s.got("%s alone: %s, p99 %s", quiet, alone, ms(alone.p99()))

	before, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	s.send("%s floods: %d clients at once (four times the default slots) for 3s, longer on a slow machine: until each of %s's 4 clients beside it had an answer", loud, floodClients, quiet)
	flood, beside := &loopFigures{}, &loopFigures{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { s.closedLoop(ctx, stop, hc, s.cfg.APIKey, floodClients, flood) })
	time.Sleep(200 * time.Millisecond) // the flood has taken the slots
	wg.Go(func() { s.closedLoop(ctx, stop, hc, quietKey, 4, beside) })
	tick := time.NewTicker(time.Second)
	for second := 1; ; second++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			close(stop)
			wg.Wait()
			return ctx.Err()
		}
		s.note("after %ds: %s %s · %s %s, p99 %s", second, loud, flood, quiet, beside, ms(beside.p99()))
		// However slow the machine, the flood goes on until the quiet
		// tenant's every client was answered once, or a minute passed.
		if second >= 3 && (beside.answered.Load() >= 4 || second >= floodAtMost) {
			break
		}
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	s.table([][]string{
		{"tenant", "clients", "answered 201", "refused (503, 429)", "p99"},
		{quiet + ", alone", "4", strconv.FormatInt(alone.answered.Load(), 10), strconv.FormatInt(alone.refused.Load(), 10), ms(alone.p99())},
		{loud + ", flooding", strconv.Itoa(floodClients), strconv.FormatInt(flood.answered.Load(), 10), strconv.FormatInt(flood.refused.Load(), 10), ms(flood.p99())},
		{quiet + ", beside the flood", "4", strconv.FormatInt(beside.answered.Load(), 10), strconv.FormatInt(beside.refused.Load(), 10), ms(beside.p99())},
	})

	s.send("GET /metrics  orderservice_http_refused_total, before and after the flood")
	after, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	rows := [][]string{{"tenant", "reason", "refused"}}
	refusedOf := map[string]float64{}
	for _, r := range refusals(before, after) {
		refusedOf[r.tenant] += r.n
		rows = append(rows, []string{r.tenant, r.reason, number(r.n)})
	}
	if len(rows) > 1 {
		s.table(rows)
	} else {
		s.got("no refusal: every request of the flood waited its turn in %s's own queue", loud)
	}

	s.send("GET /v1/orders?limit=1  as %s: what is left of its quotas", loud)
	a, err := s.get(ctx, s.cfg.BaseURL+"/v1/orders?limit=1", true)
	if err != nil {
		return err
	}
	s.got("RateLimit-Policy: %s", a.header.Get("RateLimit-Policy"))
	s.got("RateLimit: %s", a.header.Get("RateLimit"))

	s.check(beside.answered.Load() > 0 && beside.refused.Load() == 0 && beside.other.Load() == 0,
		"%s, within its share, had every request answered beside the flood (%s)", quiet, beside)
	s.check(refusedOf[quiet] == 0, "/metrics counts no refusal of %s; %s's own excess is counted as its own (%s)", quiet, loud, number(refusedOf[loud]))
	s.check(strings.HasPrefix(a.header.Get("RateLimit-Policy"), `"requests";q=`) && strings.HasPrefix(a.header.Get("RateLimit"), `"requests";r=`),
		"every /v1 answer says the tenant's quota policies and what is left of them (RateLimit-Policy, RateLimit)")
	return nil
}

// refused is how many requests of a tenant were refused for a reason.
type refused struct {
	tenant, reason string
	n              float64
}

// refusals are the increases of orderservice_http_refused_total between
// two scrapes, by tenant and reason, summed over the instances.
func refusals(before, after metricSnapshot) []refused {
	const name = "orderservice_http_refused_total"
	seen := map[[2]string]bool{}
	var out []refused
	for _, series := range after {
		for s := range series {
			if !strings.HasPrefix(s, name+"{") {
				continue
			}
			k := [2]string{labelOf(s, "tenant"), labelOf(s, "reason")}
			if seen[k] {
				continue
			}
			seen[k] = true
			labels := []string{`tenant="` + k[0] + `"`, `reason="` + k[1] + `"`}
			if n := valueOf(after, before, name, labels) - valueOf(before, after, name, labels); n > 0 {
				out = append(out, refused{k[0], k[1], n})
			}
		}
	}
	slices.SortFunc(out, func(a, b refused) int { return strings.Compare(a.tenant+a.reason, b.tenant+b.reason) })
	return out
}

// labelOf reads one label's value from a series name with labels.
func labelOf(series, label string) string {
	_, rest, ok := strings.Cut(series, label+`="`)
	if !ok {
		return ""
	}
	value, _, _ := strings.Cut(rest, `"`)
	return value
}

// ms writes a latency in whole milliseconds.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
