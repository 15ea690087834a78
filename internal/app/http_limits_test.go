package app_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
)

// Two tenants: one only ever sends rejected requests, so "0 rows written" is
// checked after every single one; the other sends the accepted boundaries.
const (
	rejectedKey = "rejected-key-1"
	acceptedKey = "accepted-key-1"
)

func startLimits(t *testing.T) (m *app.Main, rejected, accepted *apptest.Client) {
	t.Helper()
	m = apptest.Start(t, dbURL, map[string]string{"API_KEYS": "rejected=" + rejectedKey + ",accepted=" + acceptedKey})
	return m, apptest.NewClient(m, rejectedKey), apptest.NewClient(m, acceptedKey)
}

// rejectedRows counts the rejecting tenant's orders and idempotency records.
func rejectedRows(t *testing.T, m *app.Main) (orders, records int64) {
	t.Helper()
	return apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = 'rejected'"),
		apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'rejected'")
}

// wantNothingWritten runs send and asserts that it wrote no order and no
// idempotency record.
func wantNothingWritten(t *testing.T, m *app.Main, send func()) {
	t.Helper()
	orders, records := rejectedRows(t, m)
	send()
	if o, r := rejectedRows(t, m); o != orders || r != records {
		t.Errorf("a rejected request wrote %d orders and %d idempotency records", o-orders, r-records)
	}
}

// items returns n valid item objects.
func items(n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{"sku": fmt.Sprintf("SKU-%d", i), "quantity": 1, "unit_price": 1}
	}
	return out
}

func withItems(customer string, its ...map[string]any) map[string]any {
	return map[string]any{"customer_id": customer, "currency": "EUR", "items": its}
}

func item(sku string, quantity, unitPrice any) map[string]any {
	return map[string]any{"sku": sku, "quantity": quantity, "unit_price": unitPrice}
}

// rawCreate writes a create request by hand over TCP, for header bytes Go's
// client will not send (NUL, other control characters).
func rawCreate(t *testing.T, m *app.Main, apiKey, idempotencyKey, body string) apptest.Response {
	t.Helper()
	addr := strings.TrimPrefix(m.URL(), "http://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", addr, apiKey, idempotencyKey, len(body), body)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return apptest.Response{Status: res.StatusCode, Header: res.Header, Body: b}
}

func TestLimitsAndBadInput(t *testing.T) {
	m, rejected, accepted := startLimits(t)
	valid := purchase("cus_limits")

	type rejection struct {
		name   string
		key    string
		header http.Header
		body   any
		status int
		code   string
		field  string // the field the problem names, when it names one
	}
	run := func(t *testing.T, cases []rejection) {
		t.Helper()
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				key := tc.key
				if key == "" {
					key = fmt.Sprintf("rejected-%d", i)
				}
				var r apptest.Response
				wantNothingWritten(t, m, func() {
					var err error
					if r, err = rejected.Send(http.MethodPost, "/v1/orders", key, tc.body, tc.header); err != nil {
						t.Fatal(err)
					}
				})
				apptest.WantProblem(t, r, tc.status, tc.code)
				if tc.field != "" {
					if got := r.JSON(t)["field"]; got != tc.field {
						t.Errorf("field = %v, want %s", got, tc.field)
					}
				}
			})
		}
	}

	t.Run("items", func(t *testing.T) {
		t.Run("exactly 100 items are accepted", func(t *testing.T) {
			r := accepted.Do(t, http.MethodPost, "/v1/orders", "items-100", withItems("cus_100", items(100)...))
			if r.Status != http.StatusCreated || len(r.JSON(t)["items"].([]any)) != 100 {
				t.Fatalf("= %d %.300s", r.Status, r.Body)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.customer_id = 'cus_100'"); n != 100 {
				t.Errorf("item rows = %d, want 100", n)
			}
		})
		run(t, []rejection{
			{name: "1000 items are 400 naming items", body: withItems("c", items(1000)...), status: 400, code: "invalid_request", field: "items"},
		})
	})

	t.Run("idempotency keys", func(t *testing.T) {
		k255 := strings.Repeat("k", 255)
		t.Run("a 255-character key is accepted and stored whole", func(t *testing.T) {
			r := accepted.Do(t, http.MethodPost, "/v1/orders", k255, purchase("cus_k255"))
			if r.Status != http.StatusCreated {
				t.Fatalf("= %d %s", r.Status, r.Body)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'accepted' AND idempotency_key = ?", k255); n != 1 {
				t.Errorf("records under the 255-character key = %d", n)
			}
		})
		t.Run("the quoted form of a 255-character key (257 bytes sent) is the same intent", func(t *testing.T) {
			r := accepted.Do(t, http.MethodPost, "/v1/orders", `"`+k255+`"`, purchase("cus_k255"))
			if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("= %d %v %s", r.Status, r.Header, r.Body)
			}
		})
		run(t, []rejection{
			{name: "a quoted 256-character key is 400", key: `"` + strings.Repeat("k", 256) + `"`, body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a zero-width space in a key is 400", key: "R1\u200b", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a right-to-left override in a key is 400", key: "\u202eR1", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "fullwidth letters in a key are 400", key: "\uff32\uff11", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a Cyrillic look-alike in a key is 400", key: "\u0420\u0031", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a combining accent in a key is 400", key: "R\u03011", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a byte-order mark in a key is 400", key: "\ufeffR1", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a no-break space in a key is 400", key: "R\u00a01", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a byte that is not UTF-8 in a key is 400", key: "R\xff1", body: valid, status: 400, code: "idempotency_key_invalid"},
			{name: "a quoted key with an unknown escape is 400", key: `"R\n1"`, body: valid, status: 400, code: "idempotency_key_invalid"},
		})
		for _, k := range []struct{ name, key string }{
			{"NUL", "R\x001"}, {"SOH", "R\x011"}, {"ESC", "R\x1b[31m"}, {"DEL", "R\x7f1"}, {"a lone CR", "R\r1"},
		} {
			t.Run("a key with "+k.name+" sent over raw TCP is 400 and reaches nothing", func(t *testing.T) {
				var r apptest.Response
				wantNothingWritten(t, m, func() {
					r = rawCreate(t, m, rejectedKey, k.key, `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`)
				})
				if r.Status != http.StatusBadRequest {
					t.Fatalf("= %d %s", r.Status, r.Body)
				}
				// net/http rejects the header itself, before any handler runs;
				// if a handler ever sees it, it must name the key.
				if r.Header.Get("Content-Type") == "application/problem+json" {
					apptest.WantProblem(t, r, http.StatusBadRequest, "idempotency_key_invalid")
				}
			})
		}
	})

	t.Run("text fields", func(t *testing.T) {
		for _, s := range []string{"客户-Ünïcödé", "👩\u200d💻-emoji", "עברית-\u200f", "ＲＩ-fullwidth", "e\u0301-combining"} {
			t.Run(fmt.Sprintf("valid unicode %q is accepted and stored as sent", s), func(t *testing.T) {
				r := accepted.Do(t, http.MethodPost, "/v1/orders", "unicode-"+fmt.Sprintf("%x", s), withItems(s, item(s, 1, 100)))
				if r.Status != http.StatusCreated {
					t.Fatalf("= %d %s", r.Status, r.Body)
				}
				o := r.JSON(t)
				if o["customer_id"] != s || o["items"].([]any)[0].(map[string]any)["sku"] != s {
					t.Errorf("stored as %v / %v", o["customer_id"], o["items"])
				}
			})
		}
		t.Run("a customer_id of 100 characters and a sku of 64 characters are accepted, whatever their bytes", func(t *testing.T) {
			r := accepted.Do(t, http.MethodPost, "/v1/orders", "text-bounds", withItems(strings.Repeat("c", 99)+"ü", item(strings.Repeat("s", 63)+"€", 1, 1)))
			if r.Status != http.StatusCreated {
				t.Fatalf("= %d %s", r.Status, r.Body)
			}
		})
		cases := []rejection{
			{name: "a currency spelled with a long s (uſd) is 400, not read as USD", body: map[string]any{"customer_id": "c", "currency": "u\u017fd", "items": items(1)},
				status: 400, code: "invalid_request", field: "currency"},
			{name: "a currency spelled with a dotless i (ınr) is 400, not read as INR", body: map[string]any{"customer_id": "c", "currency": "\u0131nr", "items": items(1)},
				status: 400, code: "invalid_request", field: "currency"},
			{name: "a customer_id of 101 characters is 400", body: withItems(strings.Repeat("c", 100)+"ü", item("S", 1, 1)), status: 400, code: "invalid_request", field: "customer_id"},
			{name: "a sku of 65 characters is 400", body: withItems("c", item(strings.Repeat("s", 64)+"€", 1, 1)), status: 400, code: "invalid_request", field: "items[0].sku"},
		}
		for _, c := range []struct{ name, text string }{
			{"NUL", "a\x00b"}, {"SOH", "a\x01b"}, {"a newline", "a\nb"}, {"ESC", "a\x1b[2Jb"}, {"DEL", "a\x7fb"},
			{"the C1 control NEL", "a\u0085b"}, {"the C1 control CSI", "a\u009b31mb"},
		} {
			cases = append(cases,
				rejection{name: "a customer_id with " + c.name + " is 400", body: withItems(c.text, item("S", 1, 1)), status: 400, code: "invalid_request", field: "customer_id"},
				rejection{name: "a sku with " + c.name + " is 400", body: withItems("c", item(c.text, 1, 1)), status: 400, code: "invalid_request", field: "items[0].sku"})
		}
		run(t, cases)
	})

	t.Run("amounts", func(t *testing.T) {
		t.Run("the largest total (100 lines of 1000 at the largest price) is accepted and sent back exactly", func(t *testing.T) {
			its := items(100)
			for _, it := range its {
				it["quantity"], it["unit_price"] = 1000, int64(10_000_000_000)
			}
			r := accepted.Do(t, http.MethodPost, "/v1/orders", "max-total", withItems("cus_max", its...))
			if r.Status != http.StatusCreated || !bytes.Contains(r.Body, []byte(`"total_amount":1000000000000000`)) {
				t.Fatalf("= %d %.300s", r.Status, r.Body)
			}
		})
		big := func(v string) string {
			return `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":` + v + `}]}`
		}
		run(t, []rejection{
			{name: "a negative quantity is 400", body: withItems("c", item("S", -1, 1)), status: 400, code: "invalid_request", field: "items[0].quantity"},
			// 0 is a price, so a missing or null one must not read as 0.
			{name: "an item without its unit_price is 400, not a free item", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1}]}`,
				status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a null unit_price is 400", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":null}]}`,
				status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a null quantity is 400", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":null,"unit_price":1}]}`,
				status: 400, code: "invalid_request", field: "items[0].quantity"},
			{name: "a null metadata value is 400, not stored as empty", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}],"metadata":{"k":null}}`,
				status: 400, code: "invalid_request", field: "metadata.k"},
			{name: "a null customer_id is 400", body: `{"customer_id":null,"currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`,
				status: 400, code: "invalid_request", field: "customer_id"},
			{name: "NUL inside a string is 400, never PostgreSQL's rejection", body: `{"customer_id":"a\u0000b","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`,
				status: 400, code: "invalid_request", field: "customer_id"},
			{name: "a lone surrogate inside a string is 400", body: `{"customer_id":"a\ud800b","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`,
				status: 400, code: "invalid_request"},
			{name: "invalid UTF-8 inside a string is 400", body: "{\"customer_id\":\"caf\xe9\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"S\",\"quantity\":1,\"unit_price\":1}]}",
				status: 400, code: "invalid_request"},
			{name: "an unknown member of an item is still 400 naming it", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1,"colour":"red"}]}`,
				status: 400, code: "invalid_request", field: "items[0].colour"},
			{name: "two Authorization headers are 400", body: withItems("c", item("S", 1, 1)), header: http.Header{"Authorization": {"Bearer " + apptest.KeyAcme, "Bearer " + apptest.KeyGlobex}},
				status: 400, code: "invalid_request", field: "Authorization"},
			{name: "quantity 1001 is 400", body: withItems("c", item("S", 1001, 1)), status: 400, code: "invalid_request", field: "items[0].quantity"},
			{name: "a quantity beyond int64 is 400", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":9223372036854775808,"unit_price":1}]}`,
				status: 400, code: "invalid_request", field: "items[0].quantity"},
			{name: "a fractional quantity is 400", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1.5,"unit_price":1}]}`,
				status: 400, code: "invalid_request", field: "items[0].quantity"},
			{name: "the smallest int64 as a price is 400", body: big("-9223372036854775808"), status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a price of 2^63 is 400", body: big("9223372036854775808"), status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a price with 10000 digits is 400", body: big("1" + strings.Repeat("0", 10000)), status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a price of 1e400 is 400", body: big("1e400"), status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a price as a string is 400", body: big(`"100"`), status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a price one above the largest (10^10) is 400", body: withItems("c", item("S", 1, int64(10_000_000_001))),
				status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "unit_price 2^62 times quantity 4 would overflow: 400, not a wrapped total", body: withItems("c", item("S", 4, int64(1)<<62)),
				status: 400, code: "invalid_request", field: "items[0].unit_price"},
			{name: "a second line at the largest int64 is 400 naming it", body: withItems("c", item("A", 1, 1), item("B", 1, int64(1<<63-1))),
				status: 400, code: "invalid_request", field: "items[1].unit_price"},
			{name: "a hundred lines of 2^57 each overflow the total: 400", body: withItems("c", func() []map[string]any {
				its := items(100)
				for _, it := range its {
					it["unit_price"] = int64(1) << 57
				}
				return its
			}()...), status: 400, code: "invalid_request"},
		})
	})

	t.Run("JSON shape", func(t *testing.T) {
		run(t, []rejection{
			{name: "arrays nested 100000 deep are 400", body: `{"customer_id":"c","metadata":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`,
				status: 400, code: "invalid_request"},
			{name: "objects nested 20000 deep are 400", body: strings.Repeat(`{"metadata":`, 20000) + `{}` + strings.Repeat("}", 20000),
				status: 400, code: "invalid_request"},
			{name: "a nested value in an unknown field is 400 naming it", body: `{"customer_id":"c","extra":[[[[{"a":[1]}]]]]}`,
				status: 400, code: "invalid_request", field: "extra"},
			{name: "a duplicate key is 400, not the last value silently", body: `{"customer_id":"c","currency":"EUR","currency":"USD","items":[{"sku":"S","quantity":1,"unit_price":1}]}`,
				status: 400, code: "invalid_request"},
			{name: "a duplicate items array is 400", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}],"items":[{"sku":"S","quantity":9,"unit_price":1}]}`,
				status: 400, code: "invalid_request"},
			{name: "a key repeated in another case is 400", body: `{"customer_id":"c","currency":"EUR","CURRENCY":"USD","items":[{"sku":"S","quantity":1,"unit_price":1}]}`,
				status: 400, code: "invalid_request"},
			{name: "a NUL in a metadata value is 400, not a 500 from jsonb", body: `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}],"metadata":{"note":"a\u0000b"}}`,
				status: 400, code: "invalid_request", field: "metadata.note"},
			{name: "21 metadata entries are 400", body: map[string]any{"customer_id": "c", "currency": "EUR", "items": items(1), "metadata": func() map[string]string {
				md := map[string]string{}
				for i := range 21 {
					md[fmt.Sprint("k", i)] = "v"
				}
				return md
			}()}, status: 400, code: "invalid_request", field: "metadata"},
		})
	})

	t.Run("body size", func(t *testing.T) {
		const limit = 1 << 20
		padded := func(size int) string {
			b := `{"customer_id":"cus_exact","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`
			return b[:len(b)-1] + strings.Repeat(" ", size-len(b)) + "}"
		}
		t.Run("a body of exactly 1 MiB is accepted", func(t *testing.T) {
			r := accepted.Do(t, http.MethodPost, "/v1/orders", "exact-limit", padded(limit))
			if r.Status != http.StatusCreated {
				t.Fatalf("= %d %s", r.Status, r.Body)
			}
		})
		run(t, []rejection{
			{name: "a body of 1 MiB and one byte is 413", body: padded(limit + 1), status: 413, code: "payload_too_large"},
		})
		t.Run("a chunked body over 1 MiB, with no Content-Length, is 413", func(t *testing.T) {
			// A reader of unknown length makes the client send it chunked.
			req, err := http.NewRequest(http.MethodPost, m.URL()+"/v1/orders", io.MultiReader(strings.NewReader(padded(limit+1))))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+rejectedKey)
			req.Header.Set("Idempotency-Key", "chunked")
			req.Header.Set("Content-Type", "application/json")
			var r apptest.Response
			wantNothingWritten(t, m, func() {
				res, err := rejected.HTTP.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				r = apptest.Response{Status: res.StatusCode, Header: res.Header, Body: b}
			})
			if req.ContentLength != 0 {
				t.Fatalf("the request was sent with a Content-Length of %d", req.ContentLength)
			}
			apptest.WantProblem(t, r, 413, "payload_too_large")
		})
	})
}

// A query or path whose text is not UTF-8, holds NUL, or is not valid
// percent-encoding is rejected before anything reads it: never read as
// absent, never passed to PostgreSQL (which rejects such bytes, SQLSTATE
// 22021, and that rejection read as a 500).
func TestHostileQueriesAreRefused(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "hostile=hostile-key-1"})
	c := apptest.NewClient(m, "hostile-key-1")
	for _, q := range []string{"customer_id=%00", "customer_id=a%00b", "customer_id=%ff%fe", "customer_id=caf%e9",
		"customer_id=a%C0%80", "customer_id=%ed%a0%80", "limit=%zz", "cursor=%%%", "status=%", "%ff=1"} {
		t.Run(q, func(t *testing.T) {
			r := c.Do(t, http.MethodGet, "/v1/orders?"+q, "", nil)
			apptest.WantProblem(t, r, http.StatusBadRequest, "invalid_request")
		})
	}
	for _, path := range []string{"/v1/orders/%00", "/v1/orders/%ff/events", "/v1/orders/caf%e9"} {
		t.Run(path, func(t *testing.T) {
			r := c.Do(t, http.MethodGet, path, "", nil)
			apptest.WantProblem(t, r, http.StatusBadRequest, "invalid_request")
		})
	}
	t.Run("a pay on a path id of invalid UTF-8 is 400 and records nothing", func(t *testing.T) {
		r := c.Do(t, http.MethodPost, "/v1/orders/%ff/pay", "hostile-path-pay", map[string]any{"payment_method": "pm_ok"})
		apptest.WantProblem(t, r, http.StatusBadRequest, "invalid_request")
	})
}

// A list's and a history's query is read here: a limit that is no integer
// in 1..100, an unknown status or a cursor the service never returned is
// 400 invalid_request.
func TestBadListAndHistoryParametersAre400(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "pager=pager-key-1"})
	c := apptest.NewClient(m, "pager-key-1")
	id := placeAnOrder(t, c)
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "status=LOST", "cursor=zzz", "cursor=not*base64"} {
		apptest.WantProblem(t, c.Do(t, http.MethodGet, "/v1/orders?"+q, "", nil), http.StatusBadRequest, "invalid_request")
	}
	for _, q := range []string{"limit=0", "limit=101", "cursor=not-a-cursor"} {
		apptest.WantProblem(t, c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events?"+q, "", nil), http.StatusBadRequest, "invalid_request")
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	// A tenant of this run's own: what it writes is counted.
	careless := "careless-" + uuid.NewString()[:8]
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": careless + "=careless-key-1"})
	c := apptest.NewClient(m, "careless-key-1")
	valid := purchase("cus_bad")
	tooMany := make([]map[string]any, 101)
	for i := range tooMany {
		tooMany[i] = map[string]any{"sku": "S", "quantity": 1, "unit_price": 1}
	}
	cases := []struct {
		name   string
		key    string
		header http.Header
		body   any
		status int
		code   string
	}{
		{"no Idempotency-Key is 400 idempotency_key_missing", "", nil, valid, 400, "idempotency_key_missing"},
		{"a key with a space is 400 idempotency_key_invalid", "has space", nil, valid, 400, "idempotency_key_invalid"},
		{"a 256-character key is 400", strings.Repeat("k", 256), nil, valid, 400, "idempotency_key_invalid"},
		{"a key with a control character is 400", "bad\tkey", nil, valid, 400, "idempotency_key_invalid"},
		{"a text/plain body is 415", "bad-1", http.Header{"Content-Type": {"text/plain"}}, `{}`, 415, "unsupported_media_type"},
		{"a body over 1 MiB is 413", "bad-2", nil, `{"customer_id":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "payload_too_large"},
		{"malformed JSON is 400", "bad-3", nil, `{"customer_id":`, 400, "invalid_request"},
		{"a server-owned field is rejected", "bad-4", nil, map[string]any{"customer_id": "c", "currency": "EUR", "tenant_id": "globex",
			"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 1}}}, 400, "invalid_request"},
		{"a missing customer is 400", "bad-5", nil, map[string]any{"currency": "EUR", "items": valid["items"]}, 400, "invalid_request"},
		{"a bad currency is 400", "bad-6", nil, map[string]any{"customer_id": "c", "currency": "EURO", "items": valid["items"]}, 400, "invalid_request"},
		{"no items is 400", "bad-7", nil, map[string]any{"customer_id": "c", "currency": "EUR", "items": []any{}}, 400, "invalid_request"},
		{"101 items is 400", "bad-8", nil, map[string]any{"customer_id": "c", "currency": "EUR", "items": tooMany}, 400, "invalid_request"},
		{"quantity 0 is 400", "bad-9", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 0, "unit_price": 1}}}, 400, "invalid_request"},
		{"a negative price is 400", "bad-10", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": -1}}}, 400, "invalid_request"},
		{"a total that overflows int64 is 400, not a wrapped number", "bad-11", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 1000, "unit_price": int64(1) << 60}}}, 400, "invalid_request"},
		{"a price beyond int64 is 400", "bad-12", nil, `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1e30}]}`, 400, "invalid_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := c.Send(http.MethodPost, "/v1/orders", tc.key, tc.body, tc.header)
			if err != nil {
				t.Fatal(err)
			}
			apptest.WantProblem(t, r, tc.status, tc.code)
		})
	}
	t.Run("nothing was written", func(t *testing.T) {
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = ?", careless); n != 0 {
			t.Errorf("orders = %d", n)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = ?", careless); n != 0 {
			t.Errorf("records = %d", n)
		}
	})
	t.Run("the key of a rejected body may be sent again with a corrected body", func(t *testing.T) {
		r := c.Do(t, http.MethodPost, "/v1/orders", "bad-5", valid)
		if r.Status != http.StatusCreated {
			t.Fatalf("corrected = %d %s", r.Status, r.Body)
		}
	})
	t.Run("a missing or unknown API key is 401", func(t *testing.T) {
		for _, key := range []string{"", "not-a-key"} {
			c := apptest.NewClient(m, key)
			apptest.WantProblem(t, c.Do(t, http.MethodGet, "/v1/orders", "", nil), 401, "unauthenticated")
		}
	})
}
