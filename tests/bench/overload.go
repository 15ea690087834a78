package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// overloadResult is scenario 8: an open loop at Factor times the
// capacity, sent in Rounds slices, each after a slice of the closed loop
// that measures the capacity; against the service with its admission
// limit (its defaults), at other settings and with the limit off, each
// followed by a normal load that shows how soon the service is back to
// normal.
type overloadResult struct {
	// Capacity is the most creates/s the service's process answered 201
	// in a closed loop as long as the overload, at CapacityAt: the better
	// of CapacityLevels, scenario 1's best concurrency and the service's
	// in-flight limit (none above it, where the admission limit refuses
	// part of the loop). It sets the rate; each run's goodput is held
	// against the capacity measured between its own slices (see
	// overloadRun.Capacity). InProcess is scenario 1's figure there, for
	// the in-process service.
	Capacity       float64
	CapacityAt     int
	CapacityLevels []int
	InProcess      float64
	Factor         int
	Rate           int // Factor × Capacity
	For            time.Duration
	// Rounds is how many slices of For/Rounds the overload is sent in.
	Rounds int
	// NormalRate is the open loop before any overload: what "back to
	// normal" is compared with.
	NormalRate int
	Normal     point
	// NormalSlow is how many of the normal load's NormalBuckets were slow
	// by the measure BackToNormal takes: the machine's own hiccups.
	NormalSlow, NormalBuckets int
	Shed, Unshed              overloadRun
	// Limited is the same overload with the service restarted at each
	// HTTP_MAX_IN_FLIGHT of -overload-limits and each DB_MAX_CONNS of
	// -overload-pools.
	Limited       []overloadRun
	ClientTimeout time.Duration
	Limits        string // the admission settings of the shedding run
	// Cores is how the machine's CPUs were split between the load
	// generator and the service; Repinned counts the backends started
	// during the scenario that were moved to the service's CPUs within
	// repinEvery of their start.
	Cores    cores
	Repinned int
}

// Slice is how long each slice of an overload with admission control,
// and of the capacity's closed loop between them, lasts.
func (ov overloadResult) Slice() time.Duration { return ov.For / time.Duration(ov.Rounds) }

// Runs are the overloads in the order they ran: the defaults, the other
// settings, no admission control.
func (ov overloadResult) Runs() []overloadRun {
	return slices.Concat([]overloadRun{ov.Shed}, ov.Limited, []overloadRun{ov.Unshed})
}

// RefusedWithoutRetryAfter counts the refusals of the runs with admission
// control that came without Retry-After.
func (ov overloadResult) RefusedWithoutRetryAfter() int {
	n := ov.Shed.NoRetryAfter
	for _, l := range ov.Limited {
		n += l.NoRetryAfter
	}
	return n
}

// overloadRun is one overload, the capacity measured between its slices
// and the normal load right after it.
type overloadRun struct {
	// Setting is how the service ran, as the report names it: the
	// defaults, "NAME=value" or no admission control.
	Setting string
	// Rounds is how many slices of Slice the overload was sent in: the
	// scenario's Rounds, but one without admission control, whose backlog
	// grows for as long as the overload lasts; in slices, each slice's
	// backlog would drain in the pause after it, and the service would
	// look better than a sustained overload leaves it.
	Rounds int
	Slice  time.Duration
	// Point is the overload's slices pooled: every request of every slice.
	Point                      point
	Accepted, Refused, Timeout int
	Other                      int // any other answer or error
	AcceptedP50, AcceptedP99   time.Duration
	RefusedP50, RefusedP99     time.Duration
	RefusedMax                 time.Duration
	NoRetryAfter               int // refusals without Retry-After
	// Goodput is accepted creates per second, each slice from its first
	// request sent to its last answer received, pooled over the slices.
	Goodput float64
	// Capacity is creates/s answered 201 by the service with its defaults
	// in the closed loop at CapacityAt, in a slice before each slice of
	// the overload and one after the last (Capacities), pooled: a slow
	// spell of the machine's weighs on the goodput and on what it is held
	// against alike.
	Capacity   float64
	Capacities []float64
	After      point
	// BackToNormal is when, after the overload's last slice stopped
	// sending, the normal load's answers were all 201 again and no slower
	// than twice the normal p99 for recoveryHold in a row, in buckets of
	// recoveryBucket; Recovered false means not within the load after it.
	// SlowAfter counts the slow buckets after that.
	BackToNormal time.Duration
	Recovered    bool
	SlowAfter    int
	// Healthz is GET /healthz at healthzRate during the overload's slices:
	// no admission, no database, the cheapest answer the service gives.
	// HealthzP99High is an upper bound on its p99 at 95 % confidence: a
	// p99 no higher is one the probe's samples cannot tell from the floor's.
	Healthz        point
	HealthzP99High time.Duration
}

// GoodputShare is the goodput as a share of the capacity measured between
// the overload's slices.
func (r overloadRun) GoodputShare() float64 { return r.Goodput / max(r.Capacity, 1e-9) }

// CapacitySpread is the lowest and the highest of the capacity's slices.
func (r overloadRun) CapacitySpread() string {
	if len(r.Capacities) == 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f–%.0f/s", slices.Min(r.Capacities), slices.Max(r.Capacities))
}

// FloorMet reports whether the refusals were answered no slower than the
// machine's floor: their p99 no higher than the highest p99 /healthz's
// samples leave possible. The refusals' p99 comes from ten times as many
// samples as the probe's; judged against the probe's p99 alone, two
// answers drawn from one distribution would fail half the time.
func (r overloadRun) FloorMet() bool { return r.RefusedP99 <= r.HealthzP99High }

// healthzRate is high enough for the probe's p99 to be a figure (two
// thousand samples in a 20 s overload), low enough to cost the overload
// nothing it would notice.
const healthzRate = 100

const recoveryBucket = 250 * time.Millisecond

// recoveryHold is how long the service must answer normally for it to be
// back to normal: one slow bucket later is a hiccup (counted), not the
// overload still being worked off.
const recoveryHold = 2 * time.Second

// settle is the pause between a slice of the overload and the capacity's
// next slice: the admission limit refuses at once for CongestedFor after
// any refusal, and the capacity is the service's when nothing congests it.
const settle = httpapi.CongestedFor + 500*time.Millisecond

// repinEvery is how often the backends are looked at for one started
// off the service's CPUs.
const repinEvery = 100 * time.Millisecond

// overload is scenario 8. Its services run apart from the load (see
// apart). The process with the defaults stays up for the whole scenario:
// it measures the capacity, and it is the service of the defaults'
// overload.
func (b *bench) overload(ctx context.Context, res *results) (err error) {
	o := b.opts
	ov := &res.Overload
	ov.Factor, ov.For, ov.Rounds, ov.ClientTimeout = 3, o.OverloadFor, o.OverloadRounds, 10*time.Second
	ap, err := b.setApart(ctx, ov.ClientTimeout)
	if err != nil {
		return err
	}
	ov.Cores = ap.cores
	defer func() {
		err = errors.Join(err, ap.close(ctx))
		ov.Repinned = *ap.repinned
	}()
	client, launch := ap.client, ap.launch
	ref, err := launch(nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ref.Close()) }()

	// The capacity that sets the rate: the most creates/s this process
	// answered 201 in a closed loop, at scenario 1's best concurrency (all
	// of them when scenario 1 did not run) and at the service's in-flight
	// limit, the concurrency the overload runs it at; none above that
	// limit, where the loop's excess queues and is refused.
	levels := o.Concurrency
	for _, l := range res.Levels {
		if l.Service.Throughput > ov.InProcess {
			ov.InProcess, levels = l.Service.Throughput, []int{l.Concurrency}
		}
	}
	limit := ref.config.HTTP.MaxInFlight
	levels = slices.DeleteFunc(slices.Clone(levels), func(c int) bool { return c > limit })
	if !slices.Contains(levels, limit) {
		levels = append(levels, limit)
	}
	ov.CapacityLevels = levels
	for _, c := range levels {
		p, err := b.capacity(ctx, ref, c, ov.For)
		if err != nil {
			return err
		}
		if p > ov.Capacity {
			ov.Capacity, ov.CapacityAt = p, c
		}
	}
	ov.Rate = int(float64(ov.Factor) * ov.Capacity)
	ov.NormalRate = max(1, int(ov.Capacity/2))
	cfg := ref.config
	ov.Limits = fmt.Sprintf("HTTP_MAX_IN_FLIGHT=%d, HTTP_MAX_QUEUE=%d, HTTP_QUEUE_TIMEOUT=%s", cfg.HTTP.MaxInFlight, cfg.HTTP.MaxQueue, cfg.HTTP.QueueTimeout)
	if err := b.prime(ctx, ref, ov.CapacityAt); err != nil {
		return err
	}
	ov.Normal = b.fire(ctx, shot{name: "normal", client: client, rate: rate(ov.NormalRate),
		targeter: freshCreates(ref.url+"/v1/orders", &b.keys), duration: o.Duration / 2, service: ref.pid(), keepSamples: true})
	slow := slowBuckets(ov.Normal, start(ov.Normal), ov.normalLimit())
	ov.NormalSlow, ov.NormalBuckets, ov.Normal.Samples = trues(slow), len(slow), nil
	b.progress("  normal load %d/s: p50 %s p99 %s", ov.NormalRate, ms(ov.Normal.P50), ms(ov.Normal.P99))
	if ov.Shed, err = b.overloadRun(ctx, client, ov, ref, ref, "admission limit (defaults)"); err != nil {
		return err
	}

	// The same at other limits, then without admission control: the
	// service as it was. Each in a process of its own, the capacity's
	// slices still on the defaults'.
	type variable struct{ name, value string }
	var others []variable
	for _, limit := range o.OverloadLimits {
		others = append(others, variable{"HTTP_MAX_IN_FLIGHT", strconv.Itoa(limit)})
	}
	for _, pool := range o.OverloadPools {
		others = append(others, variable{"DB_MAX_CONNS", strconv.Itoa(pool)})
	}
	others = append(others, variable{"HTTP_MAX_IN_FLIGHT", "0"})
	for _, v := range others {
		svc, err := launch(map[string]string{v.name: v.value})
		if err != nil {
			return err
		}
		unshed := v.value == "0"
		setting := v.name + "=" + v.value
		if unshed {
			setting = "no admission control"
		}
		run, err := b.overloadRun(ctx, client, ov, ref, svc, setting)
		if err = errors.Join(err, svc.Close()); err != nil {
			return err
		}
		if unshed {
			ov.Unshed = run
		} else {
			ov.Limited = append(ov.Limited, run)
		}
	}
	return nil
}

// overloadRun runs one overload against svc, started with setting, in
// run.Rounds slices; before each slice and after the last, a slice of the
// closed loop that measures the capacity, on ref (the defaults' process).
func (b *bench) overloadRun(ctx context.Context, client *http.Client, ov *overloadResult, ref, svc *serviceProcess, setting string) (overloadRun, error) {
	run := overloadRun{Setting: setting, Rounds: ov.Rounds}
	if svc.config.HTTP.MaxInFlight == 0 {
		run.Rounds = 1
	}
	run.Slice = ov.For / time.Duration(run.Rounds)
	slice := run.Slice
	name := "overload " + setting
	if err := b.prime(ctx, ref, ov.CapacityAt); err != nil {
		return run, err
	}
	if svc != ref {
		if err := b.warm(ctx, svc, ov.CapacityAt); err != nil {
			return run, err
		}
	}
	var capacities, sent, probes []point
	var sending time.Duration // the slices' time, for the goodput
	// capacitySlice is one slice of the closed loop on ref.
	capacitySlice := func(round int) {
		p := b.fire(ctx, shot{name: fmt.Sprintf("%s-capacity-r%d", name, round), client: b.client, workers: ov.CapacityAt,
			targeter: freshCreates(ref.url+"/v1/orders", &b.keys), duration: slice, service: ref.pid()})
		capacities = append(capacities, p)
		run.Capacities = append(run.Capacities, p.Throughput)
	}
	url := svc.url + "/v1/orders"
	after := make(chan point, 1)
	for round := range run.Rounds {
		if round > 0 {
			select {
			case <-time.After(settle):
			case <-ctx.Done():
				return run, ctx.Err()
			}
		}
		capacitySlice(round)
		if round == run.Rounds-1 {
			go func() {
				// The normal load starts when the last slice stops sending.
				select {
				case <-time.After(slice):
				case <-ctx.Done():
				}
				// Not b.fire: the overload's shot measures the CPU with the
				// admin connection, which is not for two goroutines.
				after <- shot{name: name + "-after", client: client, rate: rate(ov.NormalRate),
					targeter: freshCreates(url, &b.keys), duration: max(ov.For/2, 2*time.Second), keepSamples: true}.fire(ctx)
			}()
		}
		probe := make(chan point, 1)
		go func() {
			// The service's cheapest answer, meanwhile: what any answer
			// costs on this machine under the overload, admission or not.
			// It goes through the overload's own client (its transport,
			// its connections), so that it and the refusals differ only in
			// route.
			probe <- shot{name: name + "-healthz", client: client, rate: rate(healthzRate),
				targeter: vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: svc.url + "/healthz"}), duration: slice, keepSamples: true}.fire(ctx)
		}()
		p := b.fire(ctx, shot{name: fmt.Sprintf("%s-r%d", name, round), client: client, rate: rate(ov.Rate), targeter: freshCreates(url, &b.keys),
			duration: slice, keepSamples: true, service: svc.pid()})
		sent, probes = append(sent, p), append(probes, <-probe)
		// Accepted answers per second from the slice's first request sent
		// to its last answer received: a backlog answered late does not
		// count as capacity.
		sending += max(p.Drain, slice)
	}
	run.After = <-after
	capacitySlice(run.Rounds)
	if err := ctx.Err(); err != nil {
		return run, err
	}
	pooled := pool(capacities)
	run.Capacity = pooled.Throughput
	run.Point, run.Healthz = pool(sent), pool(probes)
	// The probe's quantiles as the refusals' are taken (exact, from every
	// sample), so that the two compare like with like.
	probed := make([]time.Duration, len(run.Healthz.Samples))
	for i, s := range run.Healthz.Samples {
		probed[i] = s.Latency
	}
	slices.Sort(probed)
	run.Healthz.P50, run.Healthz.P90, run.Healthz.P99, run.Healthz.Samples = quantile(probed, 0.5), quantile(probed, 0.9), quantile(probed, 0.99), nil
	run.HealthzP99High = quantileHigh(probed, 0.99)
	var accepted, refused []time.Duration
	for _, s := range run.Point.Samples {
		switch {
		case s.Code == http.StatusCreated:
			accepted = append(accepted, s.Latency)
		case s.Code == http.StatusServiceUnavailable:
			refused = append(refused, s.Latency)
			run.NoRetryAfter += btoi(!s.RetryAfter)
		case s.Timeout:
			run.Timeout++
		default:
			run.Other++
		}
	}
	slices.Sort(accepted)
	slices.Sort(refused)
	run.Accepted, run.Refused = len(accepted), len(refused)
	run.AcceptedP50, run.AcceptedP99 = quantile(accepted, 0.5), quantile(accepted, 0.99)
	run.RefusedP50, run.RefusedP99, run.RefusedMax = quantile(refused, 0.5), quantile(refused, 0.99), quantile(refused, 1)
	run.Goodput = float64(run.Accepted) / sending.Seconds()
	run.BackToNormal, run.Recovered, run.SlowAfter = backToNormal(slowBuckets(run.After, start(run.After), ov.normalLimit()))
	b.progress("  %s at %d/s: %d accepted (p50 %s p99 %s), %d refused (p99 %s), %d timeouts, %d other; goodput %.0f/s = %s of the capacity between its slices (%s); back to normal after %s (%v)",
		name, ov.Rate, run.Accepted, ms(run.AcceptedP50), ms(run.AcceptedP99), run.Refused, ms(run.RefusedP99),
		run.Timeout, run.Other, run.Goodput, percentage(run.GoodputShare()), perSecond(run.Capacity), run.BackToNormal.Round(time.Millisecond), run.Recovered)
	b.progress("  %s: GET /healthz meanwhile: p50 %s p99 %s (bound at 95 %% confidence %s)", name, ms(run.Healthz.P50), ms(run.Healthz.P99), ms(run.HealthzP99High))
	return run, nil
}

// pool is the points of one load's slices as one point: every request,
// throughput over the slices' summed time. Its quantiles are left to the
// caller, which takes them from the samples.
func pool(points []point) point {
	var p point
	var ok float64
	p.Statuses = map[string]int{}
	p.CPU.OK = len(points) > 0
	for _, q := range points {
		p.Requests += q.Requests
		p.Drain += q.Drain
		p.Max = max(p.Max, q.Max)
		p.Replayed += q.Replayed
		p.Errors = append(p.Errors, q.Errors...)
		p.Samples = append(p.Samples, q.Samples...)
		for code, n := range q.Statuses {
			p.Statuses[code] += n
		}
		ok += q.Throughput * q.Drain.Seconds()
		p.CPU.Wall += q.CPU.Wall
		p.CPU.Process += q.CPU.Process
		p.CPU.Postgres += q.CPU.Postgres
		p.CPU.Other += q.CPU.Other
		p.CPU.OK = p.CPU.OK && q.CPU.OK
	}
	if s := p.Drain.Seconds(); s > 0 {
		p.Throughput, p.Rate = ok/s, float64(p.Requests)/s
	}
	return p
}

// prime empties the tables, then warms svc (see warm). Every run of this
// scenario starts here.
func (b *bench) prime(ctx context.Context, svc *serviceProcess, c int) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	return b.warm(ctx, svc, c)
}

// warm runs creates in a closed loop at c (at least the pool's size) for
// the warm-up, unmeasured, so that every connection of the service's pool
// has planned its statements on the new tables: a PostgreSQL backend
// rebuilds its caches of a table after TRUNCATE, and a measurement that
// starts on cold backends starts with a stall that is the benchmark's
// doing, not the service's. It leaves the pool's backends on the service's
// CPUs.
func (b *bench) warm(ctx context.Context, svc *serviceProcess, c int) error {
	if b.opts.Warmup > 0 {
		w := b.fire(ctx, shot{name: "overload-warmup", client: b.client, workers: max(c, b.opts.Pool),
			targeter: freshCreates(svc.url+"/v1/orders", &b.keys), duration: b.opts.Warmup})
		if w.Throughput == 0 && ctx.Err() == nil {
			return fmt.Errorf("overload warm-up: no create succeeded: %s %v", statuses(w), w.Errors)
		}
	}
	// The pool's connections are open now: their backends go to the
	// service's CPUs.
	if err := svc.cores.toService(b.backendPIDs()...); err != nil {
		return err
	}
	return ctx.Err()
}

// capacity is the creates/s svc answers 201 in a closed loop at c, for d.
func (b *bench) capacity(ctx context.Context, svc *serviceProcess, c int, d time.Duration) (float64, error) {
	if err := b.prime(ctx, svc, c); err != nil {
		return 0, err
	}
	p := b.fire(ctx, shot{name: fmt.Sprintf("capacity-c%d", c), client: b.client, workers: c,
		targeter: freshCreates(svc.url+"/v1/orders", &b.keys), duration: d, service: svc.pid()})
	b.progress("  capacity of the service's process at c=%d: %s", c, perSecond(p.Throughput))
	return p.Throughput, ctx.Err()
}

// start is when the first request of p was sent.
func start(p point) time.Time {
	if len(p.Samples) == 0 {
		return time.Time{}
	}
	first := p.Samples[0].At
	for _, s := range p.Samples {
		if s.At.Before(first) {
			first = s.At
		}
	}
	return first
}

// normalLimit is the slowest p90 a bucket of the normal load may have:
// twice the normal load's p99 (at least 10ms).
func (ov *overloadResult) normalLimit() time.Duration {
	return 2 * max(ov.Normal.P99, 5*time.Millisecond)
}

// slowBuckets cuts p into buckets of recoveryBucket by send time from
// origin and tells, for each, whether it was slow: an answer other than
// 201, or a p90 above limit.
func slowBuckets(p point, origin time.Time, limit time.Duration) []bool {
	var buckets [][]time.Duration
	var bad []bool
	for _, s := range p.Samples {
		i := max(0, int(s.At.Sub(origin)/recoveryBucket))
		for len(buckets) <= i {
			buckets, bad = append(buckets, nil), append(bad, false)
		}
		buckets[i] = append(buckets[i], s.Latency)
		bad[i] = bad[i] || s.Code != http.StatusCreated
	}
	for i, lat := range buckets {
		slices.Sort(lat)
		bad[i] = bad[i] || quantile(lat, 0.9) > limit
	}
	return bad
}

// backToNormal is the end of the last slow bucket before the first
// recoveryHold of buckets that are all normal, and how many slow buckets
// came after that hold began. Recovered is false when no such hold came
// within the load; the duration is then the load's length.
func backToNormal(slow []bool) (d time.Duration, recovered bool, slowAfter int) {
	hold := int(recoveryHold / recoveryBucket)
	for i := 0; i+hold <= len(slow); i++ {
		if !slices.Contains(slow[i:i+hold], true) {
			return time.Duration(i) * recoveryBucket, true, trues(slow[i:])
		}
	}
	return time.Duration(len(slow)) * recoveryBucket, false, 0
}

// trues is how many of bs are true.
func trues(bs []bool) int {
	n := 0
	for _, b := range bs {
		n += btoi(b)
	}
	return n
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
