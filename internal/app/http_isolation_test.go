package app_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// side is one tenant of the isolation test. Everything it writes carries its
// name (customer ids, metadata, tracking numbers, tenant-only keys), so a
// leak shows up as text in the other side's responses.
type side struct {
	name   string // as API_KEYS names the tenant
	client *apptest.Client
	other  *side

	mu  sync.Mutex
	ids []string // orders it owns, learned from its own 201s
	got map[string]bool
}

func (s *side) learn(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.got[id] {
		s.got[id] = true
		s.ids = append(s.ids, id)
	}
}

// pick returns one of the side's orders, or "" when it has none yet.
func (s *side) pick(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return ""
	}
	return s.ids[n%len(s.ids)]
}

// createBody is deterministic per (tenant, key), so a repeated key within a
// tenant is a replay and the same key in the other tenant is another intent.
func (s *side) createBody(keyIndex int) map[string]any {
	items := []map[string]any{}
	for i := range 1 + keyIndex%3 {
		items = append(items, map[string]any{"sku": fmt.Sprintf("SKU-%d", i), "quantity": 1 + i, "unit_price": 100 * (keyIndex%7 + 1)})
	}
	return map[string]any{
		"customer_id": fmt.Sprintf("%s-cus-%d", s.name, keyIndex%50),
		"currency":    "EUR",
		"items":       items,
		"metadata":    map[string]string{"owner": s.name + "-secret"},
	}
}

// kind is one sort of request in the randomised mix.
type kind int

const (
	createSharedKey kind = iota // a key from a pool both tenants draw from
	createOwnKey                // a key only this tenant uses, tagged with its name
	getOwn
	eventsOwn
	payOwn
	cancelOwn
	shipOwn
	records // the records of a shared key, an own key or the other tenant's own key
	list    // unfiltered, or filtered by the other tenant's customer
	getForeign
	eventsForeign
	actForeign  // pay, cancel, ship or deliver the other tenant's order
	guessRandom // an id that exists nowhere
)

// weights of each kind, in the order above; they add up to 100.
var weights = []int{15, 4, 10, 5, 3, 2, 2, 10, 4, 15, 10, 14, 6}

func (k kind) foreign() bool { return k >= getForeign }

type step struct {
	kind   kind
	side   *side
	n      int  // drives every other random choice of the step
	header bool // send an X-Tenant-Id (and ?tenant_id=) naming the other tenant
}

// sent is one request as sent and answered.
type sent struct {
	step
	method, path string
	resp         apptest.Response
	err          error
}

func TestTenantIsolation(t *testing.T) {
	// A database of its own: it counts every order of acme and globex.
	m := apptest.Start(t, testdb.Fresh(t, "isolation"), nil)
	acme := &side{name: "acme", client: apptest.NewClient(m, apptest.KeyAcme), got: map[string]bool{}}
	globex := &side{name: "globex", client: apptest.NewClient(m, apptest.KeyGlobex), got: map[string]bool{}}
	acme.other, globex.other = globex, acme

	const requests, workers, sharedKeys = 10_000, 16, 300
	rng := rand.New(rand.NewPCG(6, 2024))
	steps := make([]step, requests)
	for i := range steps {
		s := acme
		if rng.IntN(2) == 1 {
			s = globex
		}
		roll, k := rng.IntN(100), kind(0)
		for roll >= weights[k] {
			roll -= weights[k]
			k++
		}
		steps[i] = step{kind: k, side: s, n: rng.IntN(1 << 30), header: rng.IntN(4) == 0}
	}
	// Both tenants start with orders under the same keys, so there is
	// something to guess from the first request on.
	for i := range 20 {
		for _, s := range []*side{acme, globex} {
			r := s.client.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("k-%d", i), s.createBody(i))
			if r.Status != http.StatusCreated {
				t.Fatalf("seed create: %d %s", r.Status, r.Body)
			}
			s.learn(r.JSON(t)["id"].(string))
		}
	}

	began := time.Now()
	results := make([]sent, requests)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				results[i] = send(steps[i], i, sharedKeys)
			}
		})
	}
	for i := range steps {
		next <- i
	}
	close(next)
	wg.Wait()

	t.Logf("%d requests in %s", requests, time.Since(began).Round(time.Millisecond))
	owner := ownersOfSecrets(t, m)
	var failures, leaks []string
	statuses := map[string]map[int]int{}
	foreign, sharedKeysUsed, notFound := 0, map[string]map[string]bool{}, map[string]int{}
	for _, r := range results {
		name := fmt.Sprintf("%s %s %s as %s", kindName(r.kind), r.method, r.path, r.side.name)
		if r.err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v", name, r.err))
			continue
		}
		if statuses[kindName(r.kind)] == nil {
			statuses[kindName(r.kind)] = map[int]int{}
		}
		statuses[kindName(r.kind)][r.resp.Status]++
		if why := unexpected(r); why != "" {
			failures = append(failures, fmt.Sprintf("%s: %s: %d %s", name, why, r.resp.Status, r.resp.Body))
		}
		if r.kind.foreign() {
			foreign++
			notFound[strings.ReplaceAll(string(r.resp.Body), pathID(r.path), "<id>")]++
		}
		if r.kind == createSharedKey && r.resp.Status == http.StatusCreated {
			key := sharedKey(r.n, sharedKeys)
			if sharedKeysUsed[key] == nil {
				sharedKeysUsed[key] = map[string]bool{}
			}
			sharedKeysUsed[key][r.side.name] = true
		}
		if what := leak(r.resp.Body, r.path, r.side, owner); what != "" {
			leaks = append(leaks, fmt.Sprintf("%s: %s in %s", name, what, r.resp.Body))
		}
	}
	t.Logf("statuses by kind: %v", statuses)
	t.Logf("orders: acme %d, globex %d; foreign accesses %d", len(acme.ids), len(globex.ids), foreign)

	t.Run("no response to one tenant holds the other tenant's ids, customers, keys or records", func(t *testing.T) {
		if len(owner) < 100 {
			t.Fatalf("only %d secrets to look for: the mix did not write enough", len(owner))
		}
		for _, l := range leaks[:min(len(leaks), 10)] {
			t.Error(l)
		}
		if len(leaks) > 0 {
			t.Errorf("%d of %d responses leak the other tenant's data", len(leaks), requests)
		}
	})

	t.Run("every request gets its expected answer; every foreign access is 404 order_not_found", func(t *testing.T) {
		if foreign < 2000 {
			t.Errorf("only %d foreign accesses", foreign)
		}
		for _, f := range failures[:min(len(failures), 10)] {
			t.Error(f)
		}
		if len(failures) > 0 {
			t.Errorf("%d of %d requests answered unexpectedly", len(failures), requests)
		}
	})

	t.Run("a 404 for the other tenant's order is the same document as for an order that exists nowhere", func(t *testing.T) {
		if len(notFound) != 1 {
			t.Errorf("foreign and unknown ids get %d different 404 bodies, want 1: %v", len(notFound), notFound)
		}
	})

	t.Run("the same key used by both tenants created two orders, each under its own tenant", func(t *testing.T) {
		both := 0
		for _, tenants := range sharedKeysUsed {
			if len(tenants) == 2 {
				both++
			}
		}
		if both < 100 {
			t.Fatalf("only %d keys were used by both tenants", both)
		}
		var pairs []struct {
			Key    string
			Orders int64
		}
		err := m.DB.Raw(`SELECT idempotency_key AS key, count(DISTINCT resource_id) AS orders FROM idempotency_records
			WHERE operation = 'order.create' AND idempotency_key LIKE 'k-%'
			GROUP BY idempotency_key HAVING count(DISTINCT tenant_id) = 2`).Scan(&pairs).Error
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pairs {
			if p.Orders != 2 {
				t.Errorf("key %s: %d orders for two tenants, want 2", p.Key, p.Orders)
			}
		}
		if len(pairs) < both {
			t.Errorf("%d shared keys have records in both tenants, want at least %d", len(pairs), both)
		}
		crossed := apptest.Count(t, m.DB, `SELECT count(*) FROM idempotency_records r JOIN orders o ON o.id::text = r.resource_id
			WHERE r.operation = 'order.create' AND o.tenant_id <> r.tenant_id`)
		if crossed != 0 {
			t.Errorf("%d create records point at another tenant's order", crossed)
		}
		for _, s := range []*side{acme, globex} {
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = ? AND customer_id NOT LIKE ?", s.name, s.name+"-cus-%"); n != 0 {
				t.Errorf("%s owns %d orders of the other tenant's customers", s.name, n)
			}
		}
		if n := apptest.Count(t, m.DB, `SELECT count(*) FROM order_events e JOIN orders o ON o.id = e.order_id
			JOIN idempotency_records r ON r.idempotency_key = e.idempotency_key AND r.operation = e.operation AND r.resource_id = o.id::text
			WHERE r.tenant_id <> o.tenant_id`); n != 0 {
			t.Errorf("%d events were caused by another tenant's intent", n)
		}
	})

	t.Run("a guess at the other tenant's order changed nothing there", func(t *testing.T) {
		n := apptest.Count(t, m.DB, `SELECT count(*) FROM order_events WHERE idempotency_key LIKE 'guess-%'`)
		if n != 0 {
			t.Errorf("%d events were written by guessed keys", n)
		}
		if n := apptest.Count(t, m.DB, `SELECT count(*) FROM payments WHERE idempotency_key LIKE 'guess-%'`); n != 0 {
			t.Errorf("%d payments were started by guessed keys", n)
		}
	})
}

// send runs one step of the mix.
func send(st step, i, sharedKeys int) sent {
	s := st.side
	h := http.Header{}
	query := ""
	if st.header {
		h.Set("X-Tenant-Id", s.other.name)
		query = "tenant_id=" + s.other.name
	}
	do := func(method, path, key string, body any) sent {
		if query != "" && strings.Contains(path, "?") {
			path += "&" + query
		} else if query != "" {
			path += "?" + query
		}
		r, err := s.client.Send(method, path, key, body, h)
		return sent{step: st, method: method, path: path, resp: r, err: err}
	}
	own, theirs := s.pick(st.n), s.other.pick(st.n)
	if own == "" && !st.kind.foreign() && st.kind != records && st.kind != list {
		st.kind = createSharedKey
	}
	if theirs == "" && st.kind.foreign() {
		st.kind = guessRandom
	}
	guessKey := fmt.Sprintf("guess-%d", i)
	switch st.kind {
	case createSharedKey:
		key := sharedKey(st.n, sharedKeys)
		return learnFrom(s, do(http.MethodPost, "/v1/orders", key, s.createBody(st.n%sharedKeys)))
	case createOwnKey:
		return learnFrom(s, do(http.MethodPost, "/v1/orders", fmt.Sprintf("%s-only-%d", s.name, st.n%100), s.createBody(1000+st.n%100)))
	case getOwn:
		return do(http.MethodGet, "/v1/orders/"+own, "", nil)
	case eventsOwn:
		return do(http.MethodGet, "/v1/orders/"+own+"/events", "", nil)
	case payOwn:
		method := "pm_ok"
		if st.n%5 == 0 {
			method = "pm_declined"
		}
		return do(http.MethodPost, "/v1/orders/"+own+"/pay", fmt.Sprintf("pay-%d", st.n%400), map[string]any{"payment_method": method})
	case cancelOwn:
		return do(http.MethodPost, "/v1/orders/"+own+"/cancel", fmt.Sprintf("cancel-%d", st.n%400), map[string]any{"reason": s.name + "-reason"})
	case shipOwn:
		return do(http.MethodPost, "/v1/orders/"+own+"/ship", fmt.Sprintf("ship-%d", st.n%400),
			map[string]any{"carrier": "DHL", "tracking_number": fmt.Sprintf("%s-trk-%d", s.name, st.n%1000)})
	case records:
		key := sharedKey(st.n, sharedKeys)
		switch st.n % 4 {
		case 1:
			key = fmt.Sprintf("%s-only-%d", s.name, st.n%100)
		case 2:
			key = fmt.Sprintf("%s-only-%d", s.other.name, st.n%100)
		case 3:
			key = fmt.Sprintf("pay-%d", st.n%400)
		}
		return do(http.MethodGet, "/v1/idempotency-records?key="+key, "", nil)
	case list:
		if st.n%2 == 0 {
			return do(http.MethodGet, fmt.Sprintf("/v1/orders?limit=100&customer_id=%s-cus-%d", s.other.name, st.n%50), "", nil)
		}
		return do(http.MethodGet, "/v1/orders?limit=20", "", nil)
	case getForeign:
		return do(http.MethodGet, "/v1/orders/"+theirs, "", nil)
	case eventsForeign:
		return do(http.MethodGet, "/v1/orders/"+theirs+"/events", "", nil)
	case actForeign:
		switch st.n % 4 {
		case 0:
			return do(http.MethodPost, "/v1/orders/"+theirs+"/pay", guessKey, map[string]any{"payment_method": "pm_ok"})
		case 1:
			return do(http.MethodPost, "/v1/orders/"+theirs+"/cancel", guessKey, map[string]any{})
		case 2:
			return do(http.MethodPost, "/v1/orders/"+theirs+"/ship", guessKey, map[string]any{"carrier": "DHL", "tracking_number": "T1"})
		default:
			return do(http.MethodPost, "/v1/orders/"+theirs+"/deliver", guessKey, nil)
		}
	default: // guessRandom
		id := fmt.Sprintf("%08x-%04x-7%03x-8%03x-%012x", st.n, st.n%0xffff, st.n%0xfff, st.n%0xfff, st.n)
		if st.n%2 == 0 {
			return do(http.MethodGet, "/v1/orders/"+id, "", nil)
		}
		return do(http.MethodPost, "/v1/orders/"+id+"/pay", guessKey, map[string]any{"payment_method": "pm_ok"})
	}
}

// pathID is the order id a path names, or "".
func pathID(path string) string {
	rest, ok := strings.CutPrefix(path, "/v1/orders/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	id, _, _ = strings.Cut(id, "?")
	return id
}

func sharedKey(n, sharedKeys int) string { return fmt.Sprintf("k-%d", n%sharedKeys) }

func learnFrom(s *side, r sent) sent {
	if r.err == nil && r.resp.Status == http.StatusCreated {
		var o struct{ ID string }
		if json.Unmarshal(r.resp.Body, &o) == nil && o.ID != "" {
			s.learn(o.ID)
		}
	}
	return r
}

// unexpected says what is wrong with an answer, or "" when it is one the
// contract allows for this kind of request.
func unexpected(r sent) string {
	status, code := r.resp.Status, problemCode(r.resp.Body)
	inProgress := status == http.StatusConflict && code == "request_in_progress"
	switch r.kind {
	case createSharedKey, createOwnKey:
		if status != http.StatusCreated && !inProgress {
			return "want 201 or 409 request_in_progress"
		}
		if status == http.StatusCreated && !strings.Contains(string(r.resp.Body), `"customer_id":"`+r.side.name+`-cus-`) {
			return "the created order is not this tenant's"
		}
	case getOwn, eventsOwn:
		if status != http.StatusOK {
			return "want 200"
		}
	case payOwn, cancelOwn, shipOwn:
		switch {
		case status == http.StatusOK, status == http.StatusPaymentRequired && r.kind == payOwn,
			status == http.StatusConflict && (code == "invalid_transition" || inProgress),
			status == http.StatusUnprocessableEntity && code == "idempotency_key_reused":
		default:
			return "want 200, 402, 409 or 422"
		}
	case records:
		var page struct{ Records []map[string]any }
		if status != http.StatusOK || json.Unmarshal(r.resp.Body, &page) != nil {
			return "want 200 with records"
		}
		if strings.Contains(r.path, r.side.other.name+"-only-") && len(page.Records) != 0 {
			return "the other tenant's key has records here"
		}
	case list:
		var page struct{ Orders []map[string]any }
		if status != http.StatusOK || json.Unmarshal(r.resp.Body, &page) != nil {
			return "want 200 with orders"
		}
		if strings.Contains(r.path, "customer_id="+r.side.other.name) && len(page.Orders) != 0 {
			return "the other tenant's customer has orders here"
		}
	default: // every foreign access
		if status != http.StatusNotFound || code != "order_not_found" {
			return "want 404 order_not_found"
		}
	}
	return ""
}

func problemCode(body []byte) string {
	var p struct{ Code string }
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// uuidPattern finds order, payment and channel ids (ch_<uuid>, re_<uuid>).
var uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// leak names the first piece of the other tenant's data in body, or "". The
// id the request itself named may be echoed (a 404's detail repeats it):
// that tells the asker nothing it did not send.
func leak(body []byte, path string, s *side, owner map[string]string) string {
	text := string(body)
	if id := pathID(path); id != "" {
		text = strings.ReplaceAll(text, id, "")
	}
	if strings.Contains(text, s.other.name) {
		return fmt.Sprintf("the name %q", s.other.name)
	}
	for _, id := range uuidPattern.FindAllString(text, -1) {
		if t, ok := owner[id]; ok && t != s.name {
			return fmt.Sprintf("%s's id %s", t, id)
		}
	}
	return ""
}

// ownersOfSecrets maps every order, payment and channel id in the database
// to the tenant that owns it: the truth, not what the responses said.
func ownersOfSecrets(t *testing.T, m *app.Main) map[string]string {
	t.Helper()
	var rows []struct{ ID, Tenant string }
	err := m.DB.Raw(`SELECT id::text AS id, tenant_id AS tenant FROM orders
		UNION ALL SELECT id::text, tenant_id FROM payments
		UNION ALL SELECT substr(channel_ref, 4), tenant_id FROM payments WHERE channel_ref IS NOT NULL`).Scan(&rows).Error
	if err != nil {
		t.Fatal(err)
	}
	owner := make(map[string]string, len(rows))
	for _, r := range rows {
		owner[r.ID] = r.Tenant
	}
	return owner
}

func kindName(k kind) string {
	return [...]string{"createSharedKey", "createOwnKey", "getOwn", "eventsOwn", "payOwn", "cancelOwn", "shipOwn",
		"records", "list", "getForeign", "eventsForeign", "actForeign", "guessRandom"}[k]
}

func TestTenantComesOnlyFromTheAPIKey(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "north=north-key-1,south=south-key-1"})
	north, south := apptest.NewClient(m, "north-key-1"), apptest.NewClient(m, "south-key-1")
	body := map[string]any{"customer_id": "north-cus-1", "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 1, "unit_price": 500}}}

	t.Run("an X-Tenant-Id naming another tenant changes nothing: the order is the key's tenant's", func(t *testing.T) {
		r, err := north.Send(http.MethodPost, "/v1/orders?tenant_id=south", "hdr-1", body, http.Header{"X-Tenant-Id": {"south"}})
		if err != nil || r.Status != http.StatusCreated {
			t.Fatalf("create = %d %s (%v)", r.Status, r.Body, err)
		}
		id := r.JSON(t)["id"].(string)
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE id = ? AND tenant_id = 'north'", id); n != 1 {
			t.Errorf("the order is not north's")
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'north' AND idempotency_key = 'hdr-1'"); n != 1 {
			t.Errorf("north has %d records for hdr-1, want 1", n)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = 'south'") +
			apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'south'"); n != 0 {
			t.Errorf("south has %d rows", n)
		}
		if r := south.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil); r.Status != http.StatusNotFound {
			t.Errorf("south reads north's order: %d", r.Status)
		}
		if r := north.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil); r.Status != http.StatusOK {
			t.Errorf("north cannot read its own order: %d", r.Status)
		}
		r, _ = south.Send(http.MethodGet, "/v1/idempotency-records?key=hdr-1", "", nil, http.Header{"X-Tenant-Id": {"north"}})
		if recs := r.JSON(t)["records"].([]any); r.Status != http.StatusOK || len(recs) != 0 {
			t.Errorf("south sees north's records: %d %s", r.Status, r.Body)
		}
		r, _ = south.Send(http.MethodGet, "/v1/orders", "", nil, http.Header{"X-Tenant-Id": {"north"}})
		if orders := r.JSON(t)["orders"].([]any); r.Status != http.StatusOK || len(orders) != 0 {
			t.Errorf("south lists north's orders: %d %s", r.Status, r.Body)
		}
	})

	id := north.Do(t, http.MethodPost, "/v1/orders", "hdr-2", body).JSON(t)["id"].(string)
	before := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records") + apptest.Count(t, m.DB, "SELECT count(*) FROM orders") +
		apptest.Count(t, m.DB, "SELECT count(*) FROM order_events") + apptest.Count(t, m.DB, "SELECT count(*) FROM payments")
	for _, tc := range []struct{ name, path, field string }{
		{"create", "/v1/orders", "tenant_id"},
		{"create", "/v1/orders", "Tenant_ID"},
		{"pay", "/v1/orders/" + id + "/pay", "tenant_id"},
		{"cancel", "/v1/orders/" + id + "/cancel", "tenant_id"},
		{"ship", "/v1/orders/" + id + "/ship", "tenant_id"},
		{"deliver", "/v1/orders/" + id + "/deliver", "tenant_id"},
	} {
		for _, tenant := range []string{"south", "north"} {
			t.Run(fmt.Sprintf("a %s body with %s %q is 400 invalid_request naming the field", tc.name, tc.field, tenant), func(t *testing.T) {
				b := map[string]any{tc.field: tenant}
				switch tc.name {
				case "create":
					for k, v := range body {
						b[k] = v
					}
				case "pay":
					b["payment_method"] = "pm_ok"
				case "ship":
					b["carrier"], b["tracking_number"] = "DHL", "T1"
				}
				r := north.Do(t, http.MethodPost, tc.path, "tenant-field-"+tc.name+"-"+tenant, b)
				p := r.JSON(t)
				if r.Status != http.StatusBadRequest || p["code"] != "invalid_request" || p["field"] != tc.field {
					t.Errorf("= %d %s", r.Status, r.Body)
				}
			})
		}
	}
	t.Run("the refused bodies wrote nothing", func(t *testing.T) {
		after := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records") + apptest.Count(t, m.DB, "SELECT count(*) FROM orders") +
			apptest.Count(t, m.DB, "SELECT count(*) FROM order_events") + apptest.Count(t, m.DB, "SELECT count(*) FROM payments")
		if after != before {
			t.Errorf("rows: %d before, %d after", before, after)
		}
		if got := north.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil).JSON(t)["status"]; got != "CREATED" {
			t.Errorf("status = %v, want CREATED", got)
		}
	})
}
