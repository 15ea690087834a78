package mockchannel

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// maxLatencyMS bounds injected latency so a typo cannot hang a test run.
const maxLatencyMS = 60_000

// Faults are the chaos settings applied to every /v1 request and to every
// webhook the channel sends.
type Faults struct {
	// LostResponseRate is the share of POSTs performed whose response is then dropped.
	LostResponseRate float64 `json:"lost_response_rate"`
	// UnavailableRate is the share of requests answered 503 before anything is done.
	UnavailableRate float64 `json:"unavailable_rate"`
	// LatencyMS is added before handling each request.
	LatencyMS int `json:"latency_ms"`
	// LatencyJitterMS adds a uniform 0..LatencyJitterMS on top of LatencyMS.
	LatencyJitterMS int `json:"latency_jitter_ms"`
	// WebhookDuplicateRate is the share of delivered webhooks sent a second
	// time at once, with the same webhook-id.
	WebhookDuplicateRate float64 `json:"webhook_duplicate_rate"`
	// WebhookDropRate is the share of webhook attempts lost on the way: the
	// receiver never sees them, and the channel retries as after a timeout.
	WebhookDropRate float64 `json:"webhook_drop_rate"`
	// WebhookDelayMS holds back the first delivery of each event recorded.
	WebhookDelayMS int `json:"webhook_delay_ms"`
	// WebhookReorderMS holds each event back a further uniform
	// 0..WebhookReorderMS, so that later events overtake earlier ones.
	WebhookReorderMS int `json:"webhook_reorder_ms"`
}

// Validate reports the first setting out of range.
func (f Faults) Validate() error {
	rates := []struct {
		name string
		v    float64
	}{{"lost_response_rate", f.LostResponseRate}, {"unavailable_rate", f.UnavailableRate},
		{"webhook_duplicate_rate", f.WebhookDuplicateRate}, {"webhook_drop_rate", f.WebhookDropRate}}
	for _, r := range rates {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%w: %s must be between 0 and 1", errInvalidRequest, r.name)
		}
	}
	latencies := []struct {
		name string
		ms   int
	}{{"latency_ms", f.LatencyMS}, {"latency_jitter_ms", f.LatencyJitterMS},
		{"webhook_delay_ms", f.WebhookDelayMS}, {"webhook_reorder_ms", f.WebhookReorderMS}}
	for _, l := range latencies {
		if l.ms < 0 || l.ms > maxLatencyMS {
			return fmt.Errorf("%w: %s must be between 0 and %d", errInvalidRequest, l.name, maxLatencyMS)
		}
	}
	return nil
}

// faultInjector holds the faults in force and the dice that apply them.
type faultInjector struct {
	mu     sync.Mutex
	faults Faults
	rng    *rand.Rand // not safe for concurrent use: guarded by mu
}

func newFaultInjector(src rand.Source) *faultInjector {
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	return &faultInjector{rng: rand.New(src)}
}

func (fi *faultInjector) get() Faults {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	return fi.faults
}

func (fi *faultInjector) set(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	fi.mu.Lock()
	defer fi.mu.Unlock()
	fi.faults = f
	return nil
}

// roll returns true with the probability rate picks from the faults in force.
func (fi *faultInjector) roll(rate func(Faults) float64) bool {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	r := rate(fi.faults)
	return r > 0 && fi.rng.Float64() < r
}

func (fi *faultInjector) latency() time.Duration {
	return fi.jittered(func(f Faults) (int, int) { return f.LatencyMS, f.LatencyJitterMS })
}

// jittered returns base plus a uniform 0..jitter milliseconds, both picked
// from the faults in force.
func (fi *faultInjector) jittered(pick func(Faults) (base, jitter int)) time.Duration {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	ms, jitter := pick(fi.faults)
	if jitter > 0 {
		ms += fi.rng.IntN(jitter + 1)
	}
	return time.Duration(ms) * time.Millisecond
}

// beforeRequest adds latency, then maybe answers 503 before anything is done.
func (fi *faultInjector) beforeRequest(ctx context.Context) error {
	if err := sleep(ctx, fi.latency()); err != nil {
		return err
	}
	if fi.roll(func(f Faults) float64 { return f.UnavailableRate }) {
		return fmt.Errorf("%w (injected fault)", errUnavailable)
	}
	return nil
}

// loseResponse decides whether a performed POST's response is dropped.
func (fi *faultInjector) loseResponse() bool {
	return fi.roll(func(f Faults) float64 { return f.LostResponseRate })
}

// webhookHoldBack is how long a new event waits before its first delivery.
func (fi *faultInjector) webhookHoldBack() time.Duration {
	return fi.jittered(func(f Faults) (int, int) { return f.WebhookDelayMS, f.WebhookReorderMS })
}

// dropWebhook decides whether a webhook attempt is lost on the way.
func (fi *faultInjector) dropWebhook() bool {
	return fi.roll(func(f Faults) float64 { return f.WebhookDropRate })
}

// duplicateWebhook decides whether a delivered webhook is sent again.
func (fi *faultInjector) duplicateWebhook() bool {
	return fi.roll(func(f Faults) float64 { return f.WebhookDuplicateRate })
}

// sleep waits d or until ctx ends, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
