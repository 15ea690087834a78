// Package naive is a DELIBERATELY WRONG order service. DO NOT COPY IT.
//
// It exists to fail. Each field of Mistakes switches on one of the common
// mistakes of docs/concepts.md ("Common mistakes"), and the code reads as
// "here is the wrong line", next to the right one it replaces. With no
// mistake switched on it is a minimal idempotent order service: the key is
// a row under a unique index in PostgreSQL, bound to the order in one
// transaction; a duplicate gets the first result replayed; the payment
// channel gets one stable key per intent. Everything else the real service
// has is left out (authentication, fingerprints and 422, leases and the
// sweeper, the state machine, the outbox): a process that dies mid-payment
// leaves its key claimed for ever here. The real thing is internal/order
// and internal/idempotency.
//
// The pitfall lessons (lab/lessons/lessons_pitfalls.go) run it in
// process, one mistake at a time, next to the real service, and measure
// the harm; `go run ./lab/naiveorders -mistake …` serves it on its own
// (see main.go). The service's own packages never import it.
package naive

import (
	"fmt"
	"strings"
)

// Mistakes are the switches, one per common mistake; the zero value makes
// none of them.
type Mistakes struct {
	// DedupOnCustomerProduct deduplicates a create on customer + products
	// instead of its Idempotency-Key: a customer's second, real purchase of
	// the same product is swallowed as a "duplicate" of the first.
	DedupOnCustomerProduct bool
	// SuccessOnAnyDuplicate answers any duplicate "200 already processed"
	// instead of replaying the first result: the retry of a declined payment
	// is told it went well.
	SuccessOnAnyDuplicate bool
	// ExpiringCache remembers keys in a cache with a TTL (Redis SET key NX
	// EX 600; here an in-process map on the service's clock, so no Redis is
	// needed and a test can let the TTL pass) instead of a row in
	// PostgreSQL: a retry after the TTL runs again.
	ExpiringCache bool
	// CheckThenInsert SELECTs the key, then INSERTs it, in a table without
	// a unique constraint: two concurrent requests both find nothing and
	// both insert.
	CheckThenInsert bool
	// NewChannelKeyPerRetry sends the payment channel a new key on every
	// attempt instead of one stable key per intent: when an answer was
	// lost, the channel takes the retry for a new payment and charges again.
	NewChannelKeyPerRetry bool
	// ShortRetention deletes records after one day instead of after the
	// longest replay window: a request replayed two days later (a broker's
	// redelivery, an operator's replay) runs again.
	ShortRetention bool
}

// switches names every mistake as the -mistake flag and the schema spell
// it, in the order of the teaching text.
var switches = []struct {
	name string
	on   func(*Mistakes) *bool
}{
	{"dedup-on-customer-product", func(m *Mistakes) *bool { return &m.DedupOnCustomerProduct }},
	{"success-on-any-duplicate", func(m *Mistakes) *bool { return &m.SuccessOnAnyDuplicate }},
	{"expiring-cache", func(m *Mistakes) *bool { return &m.ExpiringCache }},
	{"check-then-insert", func(m *Mistakes) *bool { return &m.CheckThenInsert }},
	{"new-channel-key-per-retry", func(m *Mistakes) *bool { return &m.NewChannelKeyPerRetry }},
	{"short-retention", func(m *Mistakes) *bool { return &m.ShortRetention }},
}

// Names lists every mistake's name, in the order of the teaching text.
func Names() []string {
	out := make([]string, len(switches))
	for i, sw := range switches {
		out[i] = sw.name
	}
	return out
}

// Parse switches on the mistakes named in a comma-separated list; ""
// switches on none.
func Parse(list string) (Mistakes, error) {
	var m Mistakes
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		found := false
		for _, sw := range switches {
			if sw.name == name {
				*sw.on(&m), found = true, true
			}
		}
		if !found {
			return Mistakes{}, fmt.Errorf("no mistake %q; the mistakes are %s", name, strings.Join(Names(), ", "))
		}
	}
	return m, nil
}

// String names the mistakes switched on, comma separated, or "none".
func (m Mistakes) String() string {
	var on []string
	for _, sw := range switches {
		if *sw.on(&m) {
			on = append(on, sw.name)
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

// schema is where a service with these mistakes keeps its tables: one
// schema per set of mistakes, because CheckThenInsert's tables differ (no
// unique index), and a learner can look at each with psql.
func (m Mistakes) schema() string {
	return "naive_" + strings.NewReplacer("-", "_", ",", "__").Replace(m.String())
}
