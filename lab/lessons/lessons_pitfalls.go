package lessons

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/lab/naiveorders/naive"
)

// The pitfalls, shown failing. The lessons above show what goes right; a
// learner believes it when they also see what goes wrong. Each pitfall
// lesson takes one of the common mistakes (docs/concepts.md) and the fault
// that exposes it, plays the story first against the naive order service
// of lab/naiveorders/naive with that one mistake switched on, counting
// the harm (two orders for one intent, two charges, a "success" over a
// declined payment), then takes the same steps against the real service,
// where the harm is absent. Its checks assert both.

// pitfalls are the pitfall lessons, in the order of the teaching text's
// common mistakes; All numbers them after the seed's lessons.
func pitfalls() []Lesson {
	return []Lesson{
		{
			Pitfall: "dedup-on-customer-product",
			Title:   "Deduplicating on customer + product: a real second purchase is swallowed",
			Why: "The key names an intent, not an entity. A service that deduplicates on who bought what cannot tell a retry " +
				"from a customer who really buys the same thing again: it answers the second purchase with the first order, " +
				"and a sale is lost, or paid for and never made. Two intents carry two keys; only the same key replays.",
			run: dedupOnCustomerProduct,
		},
		{
			Pitfall: "success-on-any-duplicate",
			Title:   "Success for any duplicate: the retry of a declined payment is told it went well",
			Why: "A duplicate must get the first request's real result, whatever it was: 201, 402 or 409 alike. Answering " +
				"\"already processed, OK\" to every duplicate turns a declined payment into a success for the client that " +
				"retried after losing the first answer: it ships goods nobody paid for. The record stores the result, not " +
				"only that the key was seen.",
			run: successOnAnyDuplicate,
		},
		{
			Pitfall: "expiring-cache",
			Title:   "A cache that expires: the late retry makes a second order",
			Why: "A key in a cache with a TTL (Redis SETNX with EX) is forgotten when the entry expires, is evicted or the " +
				"cache restarts, while the order it made lives on: a retry that comes after that runs again. Retries do come " +
				"late (backoff, a broker's redelivery, an operator's replay), so the key belongs in the database, as a row " +
				"under a unique index in the order's own transaction, kept as long as a replay can come.",
			run: expiringCache,
		},
		{
			Pitfall: "check-then-insert",
			Title:   "Check, then insert: concurrent duplicates all insert",
			Why: "\"SELECT the key; if absent, INSERT\" has a window between the two statements, and concurrent duplicates " +
				"(a double click, a client retrying while the first attempt still runs) all pass the check in it. Only the " +
				"database can decide which request owns a key: a unique constraint, and INSERT … ON CONFLICT DO NOTHING, so " +
				"the others wait for the first one's commit and get its result.",
			run: checkThenInsert,
		},
		{
			Pitfall: "new-channel-key-per-retry",
			Title:   "A new channel key per retry: a lost answer is charged twice",
			Why: "When the payment channel's answer is lost, the charge may have been made. A retry under a new channel key is " +
				"a new payment to the channel, which charges again; local deduplication cannot undo that. The service derives " +
				"one channel key from the intent, stores it, and sends it on every attempt, so the channel recognises the " +
				"retry and answers with the charge it already made.",
			run: newChannelKeyPerRetry,
		},
		{
			Pitfall: "short-retention",
			Title:   "A one-day retention: a replay two days later runs again",
			Why: "A deleted record protects nothing: the request replayed after its deletion finds no key and runs again. The " +
				"broker redelivers for 7 days and an operator may replay for 30, so records kept for one day leave those " +
				"replays unguarded. Retention follows the longest replay window, with a margin, and money records are " +
				"archived rather than deleted.",
			run: shortRetention,
		},
	}
}

// 1. Deduplicating on customer + product.
func dedupOnCustomerProduct(ctx context.Context, s *Session) error {
	n, err := s.naiveService(ctx, "dedup-on-customer-product")
	if err != nil {
		return err
	}
	body := s.purchase()
	var naiveIDs, serviceIDs []string
	for _, name := range []string{"R1", "R2"} {
		s.send("naive · POST /v1/orders  Idempotency-Key: %s  (customer %s, 2 × SKU-1: a real purchase)", s.key(name), body.CustomerID)
		a, err := s.naivePost(ctx, n, "/v1/orders", s.key(name), body)
		if err != nil {
			return err
		}
		s.got("%s", a)
		naiveIDs = append(naiveIDs, a.field("id"))
	}
	naiveOrders, err := s.naiveOrdersOf(ctx, n, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("naive · the customer has %s", plural(naiveOrders, "order"))

	s.note("The same two purchases, against the service:")
	for _, name := range []string{"R1", "R2"} {
		s.send("service · POST /v1/orders  Idempotency-Key: %s  (the same body)", s.key(name))
		a, err := s.post(ctx, "/v1/orders", s.key(name), body, 0)
		if err != nil {
			return err
		}
		s.got("%s", a)
		serviceIDs = append(serviceIDs, a.field("id"))
	}
	orders, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("service · the customer has %s", plural(orders, "order"))

	s.check(naiveOrders == 1 && naiveIDs[0] == naiveIDs[1] && naiveIDs[0] != "",
		"naive service: two purchases under two keys made %d order; the second was answered with the first (%s)", naiveOrders, short(naiveIDs[0]))
	s.check(orders == 2 && serviceIDs[0] != serviceIDs[1],
		"the service: the same two purchases made %d orders (%s, %s)", orders, short(serviceIDs[0]), short(serviceIDs[1]))
	return nil
}

// 2. Success for any duplicate.
func successOnAnyDuplicate(ctx context.Context, s *Session) error {
	n, err := s.naiveService(ctx, "success-on-any-duplicate")
	if err != nil {
		return err
	}
	r1, r2, declined := s.key("R1"), s.key("R2"), client.PayRequest{PaymentMethod: "pm_declined"}
	o, err := s.naiveCreate(ctx, n, r1)
	if err != nil {
		return err
	}
	var naive [2]rawAnswer
	for i, what := range []string{"pm_declined: the channel declines the card", "the same request again: its first answer was lost"} {
		s.send("naive · POST /v1/orders/%s/pay  Idempotency-Key: %s  (%s)", short(o), r2, what)
		if naive[i], err = s.naivePost(ctx, n, "/v1/orders/"+o+"/pay", r2, declined); err != nil {
			return err
		}
		if naive[i].field("code") == "" {
			s.got("%s  %s", naive[i], naive[i].body)
		} else {
			s.got("%s", naive[i])
		}
	}
	var naiveOrder client.Order
	if err := s.getJSON(ctx, n.srv.URL+"/v1/orders/"+o, false, &naiveOrder); err != nil {
		return err
	}
	naiveCharges, err := s.chargesFor(ctx, o)
	if err != nil {
		return err
	}
	s.got("naive · order %s is %s; the channel holds %s for it", short(o), naiveOrder.Status, chargeStatuses(naiveCharges))

	s.note("The same steps against the service:")
	order, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	var svc [2]rawAnswer
	for i, what := range []string{"pm_declined", "the same request again"} {
		s.send("service · POST /v1/orders/%s/pay  Idempotency-Key: %s  (%s)", short(order.ID), r2, what)
		if svc[i], err = s.post(ctx, "/v1/orders/"+order.ID+"/pay", r2, declined, 0); err != nil {
			return err
		}
		s.got("%s", svc[i])
	}
	final, err := s.view.GetOrder(ctx, order.ID)
	if err != nil {
		return err
	}
	charges, err := s.chargesFor(ctx, order.ID)
	if err != nil {
		return err
	}

	s.check(naive[0].status == http.StatusPaymentRequired && naive[1].status == http.StatusOK &&
		naiveOrder.Status != client.StatusPaid && succeeded(naiveCharges) == 0,
		"naive service: the retry was told %d OK while the payment had failed (402; order %s, %d charges at the channel)",
		naive[1].status, naiveOrder.Status, succeeded(naiveCharges))
	s.check(svc[0].status == http.StatusPaymentRequired && svc[1].status == http.StatusPaymentRequired &&
		svc[1].header.Get("Idempotent-Replayed") == "true" && bytes.Equal(svc[0].body, svc[1].body),
		"the service: the retry got the first result, 402 payment_declined, replayed byte for byte")
	s.check(final.Value.Status == client.StatusPaymentFailed && succeeded(charges) == 0,
		"the service: the order is %s and the channel charged nothing", final.Value.Status)
	return nil
}

// 3. A cache that expires.
func expiringCache(ctx context.Context, s *Session) error {
	n, err := s.naiveService(ctx, "expiring-cache")
	if err != nil {
		return err
	}
	r1, body := s.key("R1"), s.purchase()
	late := naive.DefaultCacheTTL + time.Minute
	var naiveAns [3]rawAnswer
	for i, when := range []string{"", "  (a retry at once)", "  (the late retry)"} {
		if i == 2 {
			n.svc.Clock().Advance(late)
			s.note("… %s pass on the naive service's clock (the client's backoff, or a broker's redelivery): its cache entry, set with a TTL of %s, has expired",
				late, naive.DefaultCacheTTL)
		}
		s.send("naive · POST /v1/orders  Idempotency-Key: %s%s", r1, when)
		if naiveAns[i], err = s.naivePost(ctx, n, "/v1/orders", r1, body); err != nil {
			return err
		}
		s.got("%s", naiveAns[i])
	}
	naiveOrders, err := s.naiveOrdersOf(ctx, n, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("naive · the customer has %s", plural(naiveOrders, "order"))

	s.note("The same steps against the service:")
	var svc [3]rawAnswer
	for i, when := range []string{"", "  (a retry at once)", "  (the late retry)"} {
		if i == 2 {
			s.note("(the service's clock cannot be moved on from here; what a late retry finds is its record, a row in PostgreSQL:)")
		}
		s.send("service · POST /v1/orders  Idempotency-Key: %s%s", r1, when)
		if svc[i], err = s.post(ctx, "/v1/orders", r1, body, 0); err != nil {
			return err
		}
		s.got("%s", svc[i])
	}
	kept, err := s.retentionOf(ctx, "order.create")
	if err != nil {
		return err
	}
	s.got("service · GET /v1/idempotency-policy: order.create records are kept for %s", days(kept))
	orders, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	s.check(naiveAns[1].field("id") == naiveAns[0].field("id") && naiveAns[2].status == http.StatusCreated &&
		naiveAns[2].field("id") != naiveAns[0].field("id") && naiveOrders == 2,
		"naive service: the retry at once was replayed, the retry after the TTL made a second order (%d orders for one intent)", naiveOrders)
	s.check(svc[1].header.Get("Idempotent-Replayed") == "true" && svc[2].header.Get("Idempotent-Replayed") == "true" &&
		svc[2].field("id") == svc[0].field("id") && orders == 1,
		"the service: both retries replayed the first order (%d order)", orders)
	s.check(kept > late, "the service keeps the record for %s, not %s: a late retry finds it", days(kept), naive.DefaultCacheTTL)
	return nil
}

// 4. Check, then insert.
func checkThenInsert(ctx context.Context, s *Session) error {
	const burst = 5
	n, err := s.naiveService(ctx, "check-then-insert")
	if err != nil {
		return err
	}
	r1, body := s.key("R1"), s.purchase()
	s.note("The naive service SELECTs the key, then INSERTs it, in a table without a unique constraint. The lesson holds")
	s.note("its window open until all %d requests are inside: the interleaving the race allows, made certain.", burst)
	n.svc.HoldWindowOpen(burst, 5*time.Second)
	s.send("naive · %d × POST /v1/orders  Idempotency-Key: %s  at once (a double click, a retry racing its first attempt)", burst, r1)
	naiveAns, err := s.burst(ctx, burst, func(ctx context.Context) (rawAnswer, error) { return s.naivePost(ctx, n, "/v1/orders", r1, body) })
	if err != nil {
		return err
	}
	s.got("naive · answers: %s; %d distinct orders", statuses(naiveAns), distinct(naiveAns))
	naiveOrders, err := s.naiveOrdersOf(ctx, n, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("naive · the customer has %s", plural(naiveOrders, "order"))

	s.note("The same burst against the service:")
	s.send("service · %d × POST /v1/orders  Idempotency-Key: %s  at once", burst, r1)
	svc, err := s.burst(ctx, burst, func(ctx context.Context) (rawAnswer, error) { return s.post(ctx, "/v1/orders", r1, body, 0) })
	if err != nil {
		return err
	}
	s.got("service · answers: %s; %d distinct order", statuses(svc), distinct(svc))
	orders, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	s.check(naiveOrders == burst && distinct(naiveAns) == burst,
		"naive service: %d concurrent requests of one intent made %d orders", burst, naiveOrders)
	s.check(orders == 1 && distinct(svc) == 1,
		"the service: the same %d requests made exactly %d order; the unique index let one insert, the others got its result (%s)",
		burst, orders, statuses(svc))
	return nil
}

// 5. A new channel key per retry.
func newChannelKeyPerRetry(ctx context.Context, s *Session) error {
	n, err := s.naiveService(ctx, "new-channel-key-per-retry")
	if err != nil {
		return err
	}
	r1, r2, lost := s.key("R1"), s.key("R2"), client.PayRequest{PaymentMethod: "pm_lost_response"}
	o, err := s.naiveCreate(ctx, n, r1)
	if err != nil {
		return err
	}
	before, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	var naiveAns [2]rawAnswer
	for i, what := range []string{"pm_lost_response: the channel charges, then its answer is lost", "the client retries, same key"} {
		s.send("naive · POST /v1/orders/%s/pay  Idempotency-Key: %s  (%s)", short(o), r2, what)
		if naiveAns[i], err = s.naivePost(ctx, n, "/v1/orders/"+o+"/pay", r2, lost); err != nil {
			return err
		}
		s.got("%s", naiveAns[i])
	}
	mid, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	naiveCharges, err := s.chargesFor(ctx, o)
	if err != nil {
		return err
	}
	keys := map[string]bool{}
	for _, c := range naiveCharges {
		keys[c.IdempotencyKey] = true
	}
	s.note("channel /admin/stats: charges %d → %d; the channel saw %d keys for one intent, each a new payment to it (and,",
		before.Charges, mid.Charges, len(keys))
	s.note("pm_lost_response losing the first answer of every key, lost this one too: a third try would charge a third time)")

	s.note("The same steps against the service:")
	order, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	s.send("service · POST /v1/orders/%s/pay  Idempotency-Key: %s  (pm_lost_response)", short(order.ID), r2)
	first, err := s.post(ctx, "/v1/orders/"+order.ID+"/pay", r2, lost, 0)
	if err != nil {
		return err
	}
	s.got("%s", first)
	s.send("service · client.Pay(%s, pm_lost_response, WithKey(%q))  the client retries, same key", short(order.ID), r2)
	paid, err := s.api.Pay(ctx, order.ID, lost, client.WithKey(r2))
	if err != nil {
		return err
	}
	s.got("%d order %s, charge %s", paid.Status, paid.Value.Status, chargeID(paid.Value))
	after, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	charges, err := s.chargesFor(ctx, order.ID)
	if err != nil {
		return err
	}
	s.note("channel /admin/stats: charges %d → %d, duplicates_absorbed %d → %d, lookups %d → %d",
		mid.Charges, after.Charges, mid.DuplicatesAbsorbed, after.DuplicatesAbsorbed, mid.Lookups, after.Lookups)
	requests := 0
	if len(charges) == 1 {
		requests = charges[0].Requests
	}
	// A retry after Retry-After (a busy machine, a learner pausing between
	// steps) may find the sweeper resumed the intent first: it looks the
	// charge up under the same key rather than sending it again (lesson 7).
	if paid.Replayed {
		s.note("The sweeper resumed the intent before the retry came, and looked the charge up under the same key.")
	}

	s.check(naiveAns[0].status == http.StatusServiceUnavailable && succeeded(naiveCharges) == 2 && len(keys) == 2 &&
		mid.Charges-before.Charges == 2,
		"naive service: one intent, two attempts, %d charges at the channel under %d keys (%s taken for an order of %s)",
		succeeded(naiveCharges), len(keys), euros(amountOf(naiveCharges)), euros(amountOf(naiveCharges)/int64(max(1, succeeded(naiveCharges)))))
	s.check(first.status == http.StatusServiceUnavailable && paid.Value.Status == client.StatusPaid && len(charges) == 1 && requests >= 1,
		"the service: 503, then PAID; %d charge at the channel, reached by %d requests under one key", len(charges), requests)
	if requests > 1 {
		s.check(after.Charges-mid.Charges == 1 && after.DuplicatesAbsorbed-mid.DuplicatesAbsorbed >= int64(requests-1),
			"the service: the channel's ledger grew by 1 charge and absorbed the retry (duplicates_absorbed +%d)",
			after.DuplicatesAbsorbed-mid.DuplicatesAbsorbed)
	} else {
		s.check(after.Charges-mid.Charges == 1 && after.Lookups > mid.Lookups,
			"the service: the channel's ledger grew by 1 charge, which the sweeper looked up under the same key (lookups +%d)",
			after.Lookups-mid.Lookups)
	}
	return nil
}

// 6. A one-day retention.
func shortRetention(ctx context.Context, s *Session) error {
	n, err := s.naiveService(ctx, "short-retention")
	if err != nil {
		return err
	}
	r1, body := s.key("R1"), s.purchase()
	s.send("naive · POST /v1/orders  Idempotency-Key: %s", r1)
	first, err := s.naivePost(ctx, n, "/v1/orders", r1, body)
	if err != nil {
		return err
	}
	s.got("%s", first)
	later := 48 * time.Hour
	n.svc.Clock().Advance(later)
	deleted, err := n.svc.Cleanup(ctx)
	if err != nil {
		return err
	}
	s.note("… %s pass on the naive service's clock; its nightly cleanup keeps records for %s: it deleted %d",
		days(later), days(n.svc.RetentionWindow()), deleted)
	s.send("naive · POST /v1/orders  Idempotency-Key: %s  (the same request, redelivered by the broker two days later)", r1)
	replay, err := s.naivePost(ctx, n, "/v1/orders", r1, body)
	if err != nil {
		return err
	}
	s.got("%s", replay)
	naiveOrders, err := s.naiveOrdersOf(ctx, n, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("naive · the customer has %s", plural(naiveOrders, "order"))

	s.note("The same steps against the service:")
	s.send("service · POST /v1/orders  Idempotency-Key: %s", r1)
	svcFirst, err := s.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	s.got("%s", svcFirst)
	kept, err := s.retentionOf(ctx, "order.create")
	if err != nil {
		return err
	}
	s.got("service · GET /v1/idempotency-policy: order.create records are kept for %s", days(kept))
	s.send("service · POST /v1/orders  Idempotency-Key: %s  (the redelivery: within %s, its record is there)", r1, days(kept))
	svcReplay, err := s.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	s.got("%s", svcReplay)
	orders, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	s.check(deleted >= 1 && replay.status == http.StatusCreated && replay.field("id") != first.field("id") && naiveOrders == 2,
		"naive service: the record was deleted after %s and the replay two days later made a second order (%d orders)",
		days(n.svc.RetentionWindow()), naiveOrders)
	s.check(kept > later && svcReplay.header.Get("Idempotent-Replayed") == "true" && svcReplay.field("id") == svcFirst.field("id") && orders == 1,
		"the service: records kept for %s, so the replay finds its record and gets the first order (%d order)", days(kept), orders)
	return nil
}

// The naive services: one per mistake, started in process on first use and
// kept until the session closes, so the lab can send their requests again.

type naiveServices struct {
	mu   sync.Mutex
	db   *gorm.DB
	runs map[string]*naiveRun
}

// naiveRun is one naive service, with the mistake it makes, serving.
type naiveRun struct {
	mistake string
	svc     *naive.Service
	srv     *httptest.Server
}

// naiveService returns the naive service making mistake, starting it (and
// opening its database) on first use.
func (s *Session) naiveService(ctx context.Context, mistake string) (*naiveRun, error) {
	ns := &s.naive
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if run := ns.runs[mistake]; run != nil {
		return run, nil
	}
	if ns.db == nil {
		if s.cfg.NaiveDatabaseURL == "" {
			return nil, errors.New("the naive service needs a PostgreSQL database (pass -naive-database)")
		}
		db, err := database.Open(ctx, s.cfg.NaiveDatabaseURL, database.Options{MaxConns: 10, StatementTimeout: 10 * time.Second,
			LockTimeout: 10 * time.Second, ApplicationName: "naiveorders"})
		if err != nil {
			return nil, fmt.Errorf("the naive service needs PostgreSQL at %s (pass -naive-database): %w", redacted(s.cfg.NaiveDatabaseURL), err)
		}
		ns.db = db
	}
	m, err := naive.Parse(mistake)
	if err != nil {
		return nil, err
	}
	svc, err := naive.New(ctx, naive.Config{DB: ns.db, ChannelURL: s.cfg.ChannelURL, Mistakes: m})
	if err != nil {
		return nil, err
	}
	run := &naiveRun{mistake: mistake, svc: svc, srv: httptest.NewServer(svc.Handler())}
	if ns.runs == nil {
		ns.runs = map[string]*naiveRun{}
	}
	ns.runs[mistake] = run
	s.note("naive service (lab/naiveorders), making one mistake, %s: %s, its tables in schema %s, charging at the channel %s",
		mistake, run.srv.URL, svc.Schema(), s.cfg.ChannelURL)
	return run, nil
}

// naiveCreate creates an order of s.purchase() at the naive service under
// key and returns its id.
func (s *Session) naiveCreate(ctx context.Context, n *naiveRun, key string) (string, error) {
	s.send("naive · POST /v1/orders  Idempotency-Key: %s", key)
	created, err := s.naivePost(ctx, n, "/v1/orders", key, s.purchase())
	if err != nil {
		return "", err
	}
	s.got("%s", created)
	return created.field("id"), nil
}

// naiveOf names the mistake of the naive service that u points at, or "".
func (ns *naiveServices) naiveOf(u *url.URL) string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	for _, run := range ns.runs {
		if run.srv.URL == u.Scheme+"://"+u.Host {
			return run.mistake
		}
	}
	return ""
}

// baseOf is the URL of the naive service making mistake, or "".
func (ns *naiveServices) baseOf(mistake string) string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if run := ns.runs[mistake]; run != nil {
		return run.srv.URL
	}
	return ""
}

func (ns *naiveServices) close() {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	for _, run := range ns.runs {
		run.srv.Close()
	}
	ns.runs = nil
	if ns.db != nil {
		_ = database.Close(ns.db)
		ns.db = nil
	}
}

// naivePost sends one POST to a naive service, on the lesson's timeline.
func (s *Session) naivePost(ctx context.Context, n *naiveRun, path, key string, body any) (rawAnswer, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return rawAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.srv.URL+path, bytes.NewReader(b))
	if err != nil {
		return rawAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return s.do(s.http, req)
}

// naiveOrdersOf counts a customer's orders at a naive service.
func (s *Session) naiveOrdersOf(ctx context.Context, n *naiveRun, customer string) (int, error) {
	var page struct {
		Orders []json.RawMessage `json:"orders"`
	}
	err := s.getJSON(ctx, n.srv.URL+"/v1/orders?customer_id="+url.QueryEscape(customer), false, &page)
	return len(page.Orders), err
}

// burst sends n requests at once and returns their answers. A learner
// stepping through the lesson lets the whole burst go with one step.
func (s *Session) burst(ctx context.Context, n int, send func(ctx context.Context) (rawAnswer, error)) ([]rawAnswer, error) {
	ctx = withBurst(ctx)
	answers, errs := make([]rawAnswer, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i], errs[i] = send(ctx) })
	}
	wg.Wait()
	return answers, errors.Join(errs...)
}

// retentionOf is how long the service keeps the records of operation.
func (s *Session) retentionOf(ctx context.Context, operation string) (time.Duration, error) {
	p, err := s.policy(ctx)
	if err != nil {
		return 0, err
	}
	for _, op := range p.Operations {
		if op.Operation == operation {
			return time.ParseDuration(op.Retention)
		}
	}
	return 0, fmt.Errorf("the idempotency policy names no %s", operation)
}

// statuses counts answers by status: "201 ×4, 409 ×1".
func statuses(answers []rawAnswer) string {
	count, order := map[int]int{}, []int{}
	for _, a := range answers {
		if count[a.status] == 0 {
			order = append(order, a.status)
		}
		count[a.status]++
	}
	parts := make([]string, len(order))
	for i, st := range order {
		parts[i] = fmt.Sprintf("%d ×%d", st, count[st])
	}
	return strings.Join(parts, ", ")
}

// distinct counts the different order ids among the answers.
func distinct(answers []rawAnswer) int {
	ids := map[string]bool{}
	for _, a := range answers {
		if id := a.field("id"); id != "" {
			ids[id] = true
		}
	}
	return len(ids)
}

func succeeded(charges []channelCharge) int {
	n := 0
	for _, c := range charges {
		if c.Status == "succeeded" {
			n++
		}
	}
	return n
}

// euros writes an amount in cents: "25.00 EUR" (the lessons buy in euros).
func euros(cents int64) string { return fmt.Sprintf("%d.%02d EUR", cents/100, cents%100) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func amountOf(charges []channelCharge) int64 {
	var sum int64
	for _, c := range charges {
		if c.Status == "succeeded" {
			sum += c.Amount
		}
	}
	return sum
}

// chargeStatuses says what the channel holds: "no charge", "1 declined".
func chargeStatuses(charges []channelCharge) string {
	if len(charges) == 0 {
		return "no charge"
	}
	count := map[string]int{}
	for _, c := range charges {
		count[c.Status]++
	}
	var parts []string
	for _, st := range []string{"succeeded", "declined", "pending"} {
		if count[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", count[st], st))
		}
	}
	return strings.Join(parts, ", ")
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}
