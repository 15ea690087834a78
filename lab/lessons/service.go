package lessons

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
)

// rawAnswer is one HTTP answer read whole, for lessons that show headers
// the Go client keeps to itself.
type rawAnswer struct {
	status int
	header http.Header
	body   []byte
}

// field reads a top-level string field of a JSON body ("id", "code", …).
func (a rawAnswer) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(a.body, &m)
	s, _ := m[name].(string)
	return s
}

// String is the answer the way the demo prints it: status and the headers
// that matter for idempotency.
func (a rawAnswer) String() string {
	parts := []string{fmt.Sprintf("%d %s", a.status, http.StatusText(a.status))}
	if id := a.field("id"); id != "" {
		parts = append(parts, "order "+short(id)+" "+a.field("status"))
	}
	if code := a.field("code"); code != "" {
		parts = append(parts, "code "+code)
	}
	for _, h := range []string{"Idempotent-Replayed", "Preference-Applied", "Retry-After", "Location"} {
		if v := a.header.Get(h); v != "" {
			parts = append(parts, h+": "+v)
		}
	}
	return strings.Join(parts, "  ")
}

// post sends one POST to the order service as the demo's tenant, with the
// given key and JSON body, and no retry. A timeout of zero keeps the
// default; a short one plays a client that hangs up.
func (s *Session) post(ctx context.Context, path, key string, body any, timeout time.Duration) (rawAnswer, error) {
	return s.postWith(ctx, path, key, body, timeout, nil)
}

// postWith is post with extra request headers (such as Prefer).
func (s *Session) postWith(ctx context.Context, path, key string, body any, timeout time.Duration, header http.Header) (rawAnswer, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return rawAnswer{}, err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.BaseURL+path, bytes.NewReader(b))
	if err != nil {
		return rawAnswer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for k, vs := range header {
		req.Header[k] = vs
	}
	return s.do(s.http, req)
}

// get reads url, as the demo's tenant when auth is set, and fails on a
// non-2xx answer.
func (s *Session) get(ctx context.Context, url string, auth bool) (rawAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return rawAnswer{}, err
	}
	if auth {
		req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	}
	a, err := s.do(s.look, req)
	if err == nil && (a.status < 200 || a.status > 299) {
		err = fmt.Errorf("GET %s: %d %s", url, a.status, bytes.TrimSpace(a.body))
	}
	return a, err
}

// getJSON reads url and decodes its JSON body into v.
func (s *Session) getJSON(ctx context.Context, url string, auth bool, v any) error {
	a, err := s.get(ctx, url, auth)
	if err != nil {
		return err
	}
	return json.Unmarshal(a.body, v)
}

func (s *Session) do(c *http.Client, req *http.Request) (rawAnswer, error) {
	resp, err := c.Do(req)
	if err != nil {
		return rawAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// waitsEnded reads how the service's waits for a first result have ended
// so far, from its /metrics.
func (s *Session) waitsEnded(ctx context.Context) (map[idempotency.Wake]int, error) {
	a, err := s.get(ctx, s.cfg.BaseURL+"/metrics", false)
	if err != nil {
		return nil, err
	}
	return metrics.WaitsEnded(bytes.NewReader(a.body))
}

// deadline is start+timeout, or later when a learner stepping through the
// lesson let a request go since: time spent waiting for them does not count.
func (s *Session) deadline(start time.Time, timeout time.Duration) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resume.After(start) {
		start = s.resume
	}
	return start.Add(timeout)
}

// The payment channel's admin API.

// channelStats are the channel's counters (GET /admin/stats).
type channelStats struct {
	Charges            int64 `json:"charges"`
	Refunds            int64 `json:"refunds"`
	DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
	Lookups            int64 `json:"lookups"`
	LostResponses      int64 `json:"lost_responses"`
}

func (st channelStats) String() string {
	return fmt.Sprintf("charges=%d refunds=%d duplicates_absorbed=%d lookups=%d lost_responses=%d",
		st.Charges, st.Refunds, st.DuplicatesAbsorbed, st.Lookups, st.LostResponses)
}

func (s *Session) channelStats(ctx context.Context) (channelStats, error) {
	var st channelStats
	return st, s.getJSON(ctx, s.cfg.ChannelURL+"/admin/stats", false, &st)
}

// channelCharge is one charge the channel made (GET /admin/charges), with
// how many POSTs arrived under its key.
type channelCharge struct {
	ID             string `json:"id"`
	Status         string `json:"status"`
	Amount         int64  `json:"amount"`
	Reference      string `json:"reference"`
	IdempotencyKey string `json:"idempotency_key"`
	Requests       int    `json:"requests"`
}

// chargesFor returns the channel's charges for one order: the service
// sends the order id as the charge's reference.
func (s *Session) chargesFor(ctx context.Context, orderID string) ([]channelCharge, error) {
	var all struct {
		Charges []channelCharge `json:"charges"`
	}
	if err := s.getJSON(ctx, s.cfg.ChannelURL+"/admin/charges", false, &all); err != nil {
		return nil, err
	}
	var mine []channelCharge
	for _, c := range all.Charges {
		if c.Reference == orderID {
			mine = append(mine, c)
		}
	}
	return mine, nil
}

// The order service's views of an intent.

// record is the service's record of key for one operation.
func (s *Session) record(ctx context.Context, key, operation string) (client.IdempotencyRecord, error) {
	res, err := s.view.IdempotencyRecords(ctx, key)
	if err != nil {
		return client.IdempotencyRecord{}, err
	}
	for _, r := range res.Value {
		if r.Operation == operation {
			return r, nil
		}
	}
	return client.IdempotencyRecord{}, fmt.Errorf("no %s record for key %s", operation, key)
}

// settledRecord is record read until no attempt holds it (not PROCESSING),
// for at most d (counted, as every wait of a lesson is, from the learner's
// last resume): the record as it stands between attempts. A retry (the
// sweeper's, a redelivery's) holds it PROCESSING for a moment; after d it
// is shown as it is.
func (s *Session) settledRecord(ctx context.Context, key, operation string, d time.Duration) (client.IdempotencyRecord, error) {
	start := time.Now()
	for {
		r, err := s.record(ctx, key, operation)
		if err != nil || r.State != "PROCESSING" || time.Now().After(s.deadline(start, d)) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// records are the service's records of key, one per operation, as the
// timeline's record lane shows them.
func (s *Session) records(ctx context.Context, key string) ([]Record, error) {
	res, err := s.view.IdempotencyRecords(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]Record, 0, len(res.Value))
	for _, r := range res.Value {
		out = append(out, laneRecord(r))
	}
	return out, nil
}

func laneRecord(r client.IdempotencyRecord) Record {
	lease := "none"
	if r.LeaseExpiresAt != nil {
		if left := time.Until(*r.LeaseExpiresAt); left > 0 {
			lease = fmt.Sprintf("expires in %.1fs", left.Seconds())
		} else {
			lease = fmt.Sprintf("expired %.1fs ago", -left.Seconds())
		}
	}
	return Record{Key: r.IdempotencyKey, Operation: r.Operation, State: r.State, Attempts: r.Attempts,
		LeaseToken: r.LeaseToken, Lease: lease, ResourceID: r.ResourceID}
}

// showRecord narrates the fields of a record that tell who owns the
// intent, and puts it on the record lane if it changed.
func (s *Session) showRecord(r client.IdempotencyRecord) {
	lr := laneRecord(r)
	s.got("record %s %s: state %s, attempts %d, lease_token %d, lease %s",
		lr.Operation, lr.Key, lr.State, lr.Attempts, lr.LeaseToken, lr.Lease)
	s.noteRecord(lr)
}

// waitForRecord polls the record until it is in one of states, or timeout
// passes.
func (s *Session) waitForRecord(ctx context.Context, key, operation string, timeout time.Duration, states ...string) (client.IdempotencyRecord, error) {
	start := time.Now()
	for {
		r, err := s.record(ctx, key, operation)
		if err == nil && slices.Contains(states, r.State) {
			return r, nil
		}
		if time.Now().After(s.deadline(start, timeout)) {
			if err == nil {
				err = fmt.Errorf("record %s %s still %s after %s", operation, key, r.State, timeout)
			}
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// policy is GET /v1/idempotency-policy.
type policy struct {
	ReplayWindows map[string]string `json:"replay_windows"`
	LongestWindow string            `json:"longest_window"`
	Margin        string            `json:"margin"`
	MoneyFloor    string            `json:"money_floor"`
	Lease         string            `json:"lease"`
	Operations    []struct {
		Operation string `json:"operation"`
		Retention string `json:"retention"`
		Archived  bool   `json:"archived"`
	} `json:"operations"`
	WebhookInbox string `json:"webhook_inbox_retention"`
}

func (s *Session) policy(ctx context.Context) (policy, error) {
	var p policy
	return p, s.getJSON(ctx, s.cfg.BaseURL+"/v1/idempotency-policy", true, &p)
}

// ordersOf counts the tenant's orders of one customer.
func (s *Session) ordersOf(ctx context.Context, customer string) (int, error) {
	res, err := s.view.ListOrders(ctx, client.ListOptions{CustomerID: customer, Limit: 100})
	return len(res.Value.Orders), err
}
