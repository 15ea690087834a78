package channel

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/payment"
)

// Stats counts what the channel did; tests assert on exact numbers.
type Stats struct {
	// Charges counts succeeded charges made.
	Charges int64 `json:"charges"`
	// Declined counts declined charges made.
	Declined int64 `json:"declined"`
	// Refunds counts refunds made.
	Refunds int64 `json:"refunds"`
	// DuplicatesAbsorbed counts POSTs answered from an idempotency record.
	DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
	// Lookups counts GET /v1/charges and GET /v1/refunds requests.
	Lookups int64 `json:"lookups"`
	// Requests counts every POST to /v1.
	Requests int64 `json:"requests"`
	// LostResponses counts responses dropped on purpose.
	LostResponses int64 `json:"lost_responses"`
	// UnavailableResponses counts 503s given on purpose.
	UnavailableResponses int64 `json:"unavailable_responses"`
	// AmountCharged sums the amounts of succeeded charges.
	AmountCharged int64 `json:"amount_charged"`
	// AmountRefunded sums the amounts of refunds.
	AmountRefunded int64 `json:"amount_refunded"`
}

// ChargeRecord is a charge with how the channel saw it used, for tests.
type ChargeRecord struct {
	payment.Charge
	// Requests counts the POSTs made with the charge's idempotency key.
	Requests int `json:"requests"`
	// AmountRefunded sums the refunds made against the charge.
	AmountRefunded int64 `json:"amount_refunded"`
}

// opKind names a key space: a charge key and a refund key never collide.
type opKind string

const (
	opCharge opKind = "charge"
	opRefund opKind = "refund"
)

type opKey struct {
	kind opKind
	key  string
}

// record is what the channel keeps for one idempotency key.
type record[Req comparable, Res any] struct {
	key    string
	req    Req           // the parameters a replay must match
	method string        // payment method whose test behaviour applies
	gen    uint64        // store generation, so a Reset orphans in-flight work
	done   chan struct{} // closed once status and value are set
	status int
	value  Res
}

type (
	chargeRecord = record[payment.ChargeRequest, payment.Charge]
	refundRecord = record[payment.RefundRequest, payment.Refund]
)

func newRecord[Req comparable, Res any](key string, req Req, method string, gen uint64) *record[Req, Res] {
	return &record[Req, Res]{key: key, req: req, method: method, gen: gen, done: make(chan struct{})}
}

// store is the channel's in-memory state; one mutex guards all of it.
type store struct {
	mu               sync.Mutex
	gen              uint64
	charges          map[string]*chargeRecord // by idempotency key, in flight or done
	chargesByID      map[string]*chargeRecord // done charges only
	chargeOrder      []*chargeRecord          // done charges, oldest first
	refundable       map[string]int64         // charge id -> amount not yet refunded or reserved
	refunds          map[string]*refundRecord // by idempotency key
	attempts         map[opKey]int            // POSTs per key
	unavailableGiven map[opKey]bool           // keys that got their pm_unavailable_once 503
	stats            Stats
}

func newStore() *store {
	s := &store{}
	s.reset()
	return s
}

// reset clears all state; work in flight completes into the old generation.
func (s *store) reset() {
	s.gen++
	s.charges = map[string]*chargeRecord{}
	s.chargesByID = map[string]*chargeRecord{}
	s.chargeOrder = nil
	s.refundable = map[string]int64{}
	s.refunds = map[string]*refundRecord{}
	s.attempts = map[opKey]int{}
	s.unavailableGiven = map[opKey]bool{}
	s.stats = Stats{}
}

func (s *store) update(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

// countPost counts a POST, and its key's attempts when it carries one.
func (s *store) countPost(kind opKind, key string) {
	s.update(func() {
		s.stats.Requests++
		if key != "" {
			s.attempts[opKey{kind, key}]++
		}
	})
}

func (s *store) countLookup()      { s.update(func() { s.stats.Lookups++ }) }
func (s *store) countReplay()      { s.update(func() { s.stats.DuplicatesAbsorbed++ }) }
func (s *store) countLost()        { s.update(func() { s.stats.LostResponses++ }) }
func (s *store) countUnavailable() { s.update(func() { s.stats.UnavailableResponses++ }) }

// claimCharge returns the record already held for key (fresh=false) or
// reserves a new one that the caller must complete (fresh=true).
func (s *store) claimCharge(key string, req payment.ChargeRequest) (rec *chargeRecord, fresh bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.charges[key]; ok {
		if rec.req != req {
			return nil, false, fmt.Errorf("%w: the charge under this key has other amount, currency, reference or payment_method", errKeyReused)
		}
		return rec, false, nil
	}
	if err := s.failOnce(opCharge, key, req.PaymentMethod); err != nil {
		return nil, false, err
	}
	rec = newRecord[payment.ChargeRequest, payment.Charge](key, req, req.PaymentMethod, s.gen)
	s.charges[key] = rec
	return rec, true, nil
}

// completeCharge makes the charge reserved by claimCharge.
func (s *store) completeCharge(rec *chargeRecord) {
	ch := payment.Charge{
		ID:             "ch_" + uuid.NewString(),
		Status:         payment.StatusSucceeded,
		Amount:         rec.req.Amount,
		Currency:       rec.req.Currency,
		Reference:      rec.req.Reference,
		PaymentMethod:  rec.req.PaymentMethod,
		IdempotencyKey: rec.key,
		CreatedAt:      time.Now().UTC(),
	}
	status := http.StatusCreated
	if rec.method == payment.MethodDeclined {
		ch.Status, status = payment.StatusDeclined, http.StatusPaymentRequired
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.value, rec.status = ch, status
	close(rec.done)
	if rec.gen != s.gen {
		return // reset while in flight: the charge belongs to cleared state
	}
	s.chargesByID[ch.ID] = rec
	s.chargeOrder = append(s.chargeOrder, rec)
	if ch.Status == payment.StatusDeclined {
		s.stats.Declined++
		return
	}
	s.stats.Charges++
	s.stats.AmountCharged += ch.Amount
	s.refundable[ch.ID] = ch.Amount
}

// claimRefund is claimCharge for refunds; it reserves the refunded amount so
// that concurrent refunds can never exceed the charge.
func (s *store) claimRefund(key string, req payment.RefundRequest) (rec *refundRecord, fresh bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.refunds[key]; ok {
		if rec.req != req {
			return nil, false, fmt.Errorf("%w: the refund under this key has another charge_id or amount", errKeyReused)
		}
		return rec, false, nil
	}
	charge, ok := s.chargesByID[req.ChargeID]
	if !ok {
		return nil, false, fmt.Errorf("%w: no charge %q", errChargeNotFound, req.ChargeID)
	}
	if err := s.failOnce(opRefund, key, charge.method); err != nil {
		return nil, false, err
	}
	if charge.value.Status != payment.StatusSucceeded {
		return nil, false, fmt.Errorf("%w: charge %q was %s", errRefundInvalid, req.ChargeID, charge.value.Status)
	}
	if left := s.refundable[req.ChargeID]; req.Amount > left {
		return nil, false, fmt.Errorf("%w: amount %d exceeds the %d still refundable", errRefundInvalid, req.Amount, left)
	}
	s.refundable[req.ChargeID] -= req.Amount
	rec = newRecord[payment.RefundRequest, payment.Refund](key, req, charge.method, s.gen)
	s.refunds[key] = rec
	return rec, true, nil
}

// completeRefund makes the refund reserved by claimRefund.
func (s *store) completeRefund(rec *refundRecord) {
	rf := payment.Refund{
		ID:             "re_" + uuid.NewString(),
		ChargeID:       rec.req.ChargeID,
		Status:         payment.StatusSucceeded,
		Amount:         rec.req.Amount,
		IdempotencyKey: rec.key,
		CreatedAt:      time.Now().UTC(),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.value, rec.status = rf, http.StatusCreated
	close(rec.done)
	if rec.gen != s.gen {
		return
	}
	s.stats.Refunds++
	s.stats.AmountRefunded += rf.Amount
}

// failOnce gives pm_unavailable_once its single 503 per key, before any effect.
func (s *store) failOnce(kind opKind, key, method string) error {
	k := opKey{kind, key}
	if method != payment.MethodUnavailableOnce || s.unavailableGiven[k] {
		return nil
	}
	s.unavailableGiven[k] = true
	s.stats.UnavailableResponses++
	return fmt.Errorf("%w (%s: first attempt for this key)", errUnavailable, method)
}

// charge returns the record for key, possibly still in flight, or nil.
func (s *store) charge(key string) *chargeRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges[key]
}

// refund returns the record for key, possibly still in flight, or nil.
func (s *store) refund(key string) *refundRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refunds[key]
}

func (s *store) snapshot() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// chargeRecords lists the charges made, oldest first.
func (s *store) chargeRecords() []ChargeRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ChargeRecord, 0, len(s.chargeOrder))
	for _, rec := range s.chargeOrder {
		cr := ChargeRecord{Charge: rec.value, Requests: s.attempts[opKey{opCharge, rec.key}]}
		if rec.value.Status == payment.StatusSucceeded {
			cr.AmountRefunded = rec.value.Amount - s.refundable[rec.value.ID]
		}
		out = append(out, cr)
	}
	return out
}
