package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

//go:embed tenants.md.tmpl
var tenantsText string

// tenantsResult is scenario 14, each tenant its share of the service: a
// quiet tenant's closed loop alone, then beside another tenant flooding at
// Factor times the capacity, and a client keeping BoundedClients requests
// in flight against the defaults, all against one service process with
// its defaults, apart from the load (see apart).
type tenantsResult struct {
	// Capacity is the creates/s the process answered 201 in a closed loop
	// at CapacityAt (its HTTP_MAX_IN_FLIGHT): it sets the flood's Rate.
	Capacity   float64
	CapacityAt int
	Factor     int
	Rate       int
	For        time.Duration
	// Quiet is the quiet tenant; QuietClients its closed loop.
	Quiet          string
	QuietClients   int
	BoundedClients int
	// Alone and Beside are the quiet tenant's loop without and with the
	// flood; Flood is the flooding tenant's open loop; Bounded the closed
	// loop of BoundedClients.
	Alone, Beside, Flood, Bounded tenantLoad
	Limits                        string
}

// tenantLoad is one tenant's load: its requests by what came of them.
type tenantLoad struct {
	Requests                 int
	Answered, Refused, Quota int // 201, 503, 429
	Other                    int // any other answer, or none
	// WithoutRetryAfter counts the 503s and 429s that came without one.
	WithoutRetryAfter        int
	AnsweredP50, AnsweredP99 time.Duration
	RefusedP99               time.Duration
	// AnsweredShare and RefusedShare are of Requests; refused counts 503
	// and 429 alike.
	AnsweredShare, RefusedShare float64
	Statuses                    string
	// Errors are the first few distinct errors of the requests without an
	// answer (vegeta's words), for the progress lines.
	Errors []string
}

// newTenantLoad sorts p's samples by what came of them.
func newTenantLoad(p point) tenantLoad {
	l := tenantLoad{Requests: len(p.Samples), Statuses: statuses(p), Errors: p.Errors[:min(3, len(p.Errors))]}
	var answered, refused []time.Duration
	for _, s := range p.Samples {
		switch s.Code {
		case http.StatusCreated:
			answered = append(answered, s.Latency)
		case http.StatusServiceUnavailable, http.StatusTooManyRequests:
			refused = append(refused, s.Latency)
			l.Quota += btoi(s.Code == http.StatusTooManyRequests)
			l.WithoutRetryAfter += btoi(!s.RetryAfter)
		default:
			l.Other++
		}
	}
	slices.Sort(answered)
	slices.Sort(refused)
	l.Answered, l.Refused = len(answered), len(refused)-l.Quota
	l.AnsweredP50, l.AnsweredP99, l.RefusedP99 = quantile(answered, 0.5), quantile(answered, 0.99), quantile(refused, 0.99)
	if l.Requests > 0 {
		l.AnsweredShare = float64(l.Answered) / float64(l.Requests)
		l.RefusedShare = float64(len(refused)) / float64(l.Requests)
	}
	return l
}

// The aims of issue 49 for scenario 14.
const (
	quietAnsweredAim  = 0.99 // of the quiet tenant's requests beside the flood
	quietP99Aim       = 2.0  // its p99 beside the flood ÷ alone, at most
	boundedRefusedAim = 0.01 // of the bounded client's requests, less than
)

// QuietAnsweredMet reports whether the quiet tenant had its requests
// answered beside the flood, at least quietAnsweredAim of them.
func (r tenantsResult) QuietAnsweredMet() bool { return r.Beside.AnsweredShare >= quietAnsweredAim }

// QuietP99Met reports whether its p99 beside the flood was at most
// quietP99Aim times alone.
func (r tenantsResult) QuietP99Met() bool {
	return r.Beside.Answered > 0 && r.P99Ratio() <= quietP99Aim
}

// BoundedMet reports whether the bounded client was served, not refused.
func (r tenantsResult) BoundedMet() bool {
	return r.Bounded.Requests > 0 && r.Bounded.RefusedShare < boundedRefusedAim
}

// P99Ratio is the quiet tenant's p99 beside the flood ÷ alone.
func (r tenantsResult) P99Ratio() float64 {
	return float64(r.Beside.AnsweredP99) / max(float64(r.Alone.AnsweredP99), 1)
}

// as sends t's requests as the tenant whose API key is apiKey.
func as(apiKey string, t vegeta.Targeter) vegeta.Targeter {
	return func(tg *vegeta.Target) error {
		if err := t(tg); err != nil {
			return err
		}
		tg.Header.Set("Authorization", "Bearer "+apiKey)
		return nil
	}
}

// tenants is scenario 14.
func (b *bench) tenants(ctx context.Context, res *results) (err error) {
	tr := &res.Tenants
	tr.Quiet = quietTenant
	tr.Factor, tr.For, tr.QuietClients, tr.BoundedClients = 5, b.opts.TenantsFor, 4, 64
	ap, err := b.setApart(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ap.close(ctx)) }()
	svc, err := ap.launch(map[string]string{"API_KEYS": benchTenant + "=" + benchAPIKey + "," + quietTenant + "=" + quietKey})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, svc.Close()) }()
	cfg := svc.config.HTTP
	tr.Limits = fmt.Sprintf("HTTP_MAX_IN_FLIGHT=%d, HTTP_MAX_QUEUE=%d, HTTP_QUEUE_TIMEOUT=%s", cfg.MaxInFlight, cfg.MaxQueue, cfg.QueueTimeout)
	tr.CapacityAt = cfg.MaxInFlight
	if tr.Capacity, err = b.capacity(ctx, svc, tr.CapacityAt, tr.For); err != nil {
		return err
	}
	tr.Rate = max(1, int(float64(tr.Factor)*tr.Capacity))
	url := svc.url + "/v1/orders"
	quiet := func(name string) shot {
		return shot{name: name, client: ap.client, workers: tr.QuietClients, targeter: as(quietKey, freshCreates(url, &b.keys)),
			duration: tr.For, keepSamples: true}
	}

	if err := b.prime(ctx, svc, tr.CapacityAt); err != nil {
		return err
	}
	tr.Alone = newTenantLoad(quiet("tenants-quiet-alone").fire(ctx))
	b.progress("  %s alone, %d clients: %s, answered p99 %s", quietTenant, tr.QuietClients, tr.Alone.Statuses, ms(tr.Alone.AnsweredP99))

	if err := b.prime(ctx, svc, tr.CapacityAt); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var flood point
	wg.Go(func() {
		flood = shot{name: "tenants-flood", client: ap.client, rate: rate(tr.Rate), targeter: freshCreates(url, &b.keys),
			duration: tr.For, keepSamples: true}.fire(ctx)
	})
	tr.Beside = newTenantLoad(quiet("tenants-quiet-beside").fire(ctx))
	wg.Wait()
	tr.Flood = newTenantLoad(flood)
	b.progress("  %s flooding at %d/s (%d× the capacity, %s): %s, refused p99 %s", benchTenant, tr.Rate, tr.Factor, perSecond(tr.Capacity),
		tr.Flood.Statuses, ms(tr.Flood.RefusedP99))
	b.progress("  %s beside it, %d clients: %s, answered p99 %s (%.2f× alone)", quietTenant, tr.QuietClients, tr.Beside.Statuses,
		ms(tr.Beside.AnsweredP99), tr.P99Ratio())
	for _, l := range []tenantLoad{tr.Flood, tr.Beside} {
		if len(l.Errors) > 0 {
			b.progress("  requests without an answer, first errors: %q", l.Errors)
		}
	}

	if err := b.prime(ctx, svc, tr.CapacityAt); err != nil {
		return err
	}
	tr.Bounded = newTenantLoad(shot{name: "tenants-bounded", client: ap.client, workers: tr.BoundedClients,
		targeter: freshCreates(url, &b.keys), duration: tr.For, keepSamples: true}.fire(ctx))
	b.progress("  %d closed-loop clients of %s: %s (%s refused), answered p99 %s", tr.BoundedClients, benchTenant, tr.Bounded.Statuses,
		percentage(tr.Bounded.RefusedShare), ms(tr.Bounded.AnsweredP99))
	return ctx.Err()
}
