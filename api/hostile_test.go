package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/orderservice/orderservice/tests/apptest"
)

// Hostile input, generated from api/openapi.yaml: every query parameter,
// header, path id and body field of every operation gets values an
// attacker or a broken client sends (NUL, invalid UTF-8 and lone
// surrogates, ill-formed percent-encoding, wrong JSON types, null, huge
// and deeply nested values), and every body is also sent broken as a
// whole. Each request goes to one instance and then, with the same key, to
// a second one on the same database. Whatever the service answers, it is
// never a 5xx; a 4xx is problem+json with a code the document lists, and
// the answer is one the document gives that operation; both instances
// answer alike; and a request refused as malformed (400, 401, 413, 415)
// records nothing.

// hostileQuery are raw query values, sent as they are (already encoded).
var hostileQuery = []string{
	"", "%00", "a%00b", "%ff%fe", "caf%e9", "a%C0%80", "%ed%a0%80", "%zz", "%", "%%%", "%2", "%E2%80%AE",
	"%F0%9F%98%80", "+", "%20", "-1", "0", "1e3", "99999999999999999999", "null", "%5B%5D", "'%3B--",
	"%3Cscript%3E", strings.Repeat("a", 5000), "%C3%A9", "AAAAAAAAAAM", "AZOlwn0ef_OcGy9OXWp7jA", "CREATED",
	"%0d%0a", "%09", "%7f", "%E2%80%8B", "%EF%BB%BF", "%F4%90%80%80", "%80", "%C3", "%E0%80%AF", "2147483648",
	"-0", "1.0", "0x10", "1_000", "%D9%A1", "Infinity", "NaN", "%25", "..%2F", "${jndi:x}",
}

// hostilePathIDs are raw path segments where an order id goes.
var hostilePathIDs = []string{
	"x", "0", "%00", "..%2F..%2Fetc", "0193A5C2-7D1E-7F3A-9C1B-2F4E5D6A7B8C", "0193a5c27d1e7f3a9c1b2f4e5d6a7b8c",
	"0193a5c2-7d1e-7f3a-9c1b-2f4e5d6a7b8cx", strings.Repeat("a", 5000), "%ff", "00000000-0000-0000-0000-000000000000",
	"'%20OR%201=1", "%F0%9F%98%80", "%2e%2e", "caf%e9", "%ed%a0%80", "{id}",
}

// hostileJSON are raw JSON fragments put where one body value goes.
var hostileJSON = []string{
	`null`, `true`, `false`, `0`, `-1`, `0.5`, `1e999`, `-0`, `9223372036854775808`, `[]`, `{}`, `""`, `" "`,
	`"\u0000"`, `"a\u0000b"`, "\"\xff\xfe\"", "\"caf\xe9\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", `"\ud800"`,
	`"\udfff x"`, `"\u202e"`, `"` + strings.Repeat("x", 100_000) + `"`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000),
	`{"a":` + strings.Repeat(`{"a":`, 500) + `1` + strings.Repeat(`}`, 501), `"1"`, `[1,2]`,
	`1.0`, `1e2`, `-9223372036854775809`, `"\t"`, `"\n"`, `"\u2028"`, `"\ufeff"`, `"\ud83d\ude00"`, `"%00"`,
	`"<script>"`, `"' OR 1=1 --"`, `"${jndi:ldap://x}"`, `"../../etc/passwd"`, `"NaN"`, `NaN`, `Infinity`,
	`+1`, `01`, `.5`, `1.`, "\"\x7f\"", "[" + strings.Repeat(`"x",`, 999) + `"x"]`, `{` + manyKeys(1000) + `}`,
}

func manyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(keys, ",")
}

// hostileBodies are whole bodies, broken.
var hostileBodies = []string{
	"", "null", "[]", "{}", "{", "}", `{"a":1}garbage`, "\xef\xbb\xbf{}", "\xff\xfe{}", `{"":1}`, "{}{}", "1", `"x"`,
	`{"customer_id":"a","customer_id":"b"}`, strings.Repeat(" ", 5000) + "{}", `{"items":[{}]}`,
}

// hostileHeaders are values for the headers every operation may get.
var hostileHeaders = map[string][]string{
	"Idempotency-Key": {"", " ", strings.Repeat("k", 10_000), "\xc3\xa9", "\xff", "a,b", `"quoted"`, strings.Repeat("k", 255), "k\tk"},
	"Prefer":          {"wait=-1", "wait=99999999", "wait=abc", "wait", "respond-async", "wait=5, wait=6", "\xff", "wait=1;x"},
	"Content-Type":    {"application/json; charset=latin1", "text/plain", "application/json;", "", "multipart/form-data", "application/x-www-form-urlencoded", "application/json, text/plain"},
	"Authorization":   {"", "Bearer", "Bearer ", "Basic YTpi", "bearer " + apptest.KeyAcme, "Bearer " + apptest.KeyAcme + "x", "\xff"},
}

// hostile is one request of the generated set.
type hostile struct {
	what         string
	tenantKey    string // the API key it is sent with
	method, path string // path holds the raw query, if any
	header       http.Header
	body         []byte
	twoAuth      bool
}

func TestHostileRequestsGetA4xxAndChangeNothing(t *testing.T) {
	doc := loadDoc(t)
	a := apptest.Start(t, dbURL, nil)
	b := apptest.Start(t, dbURL, nil)
	router, err := gorillamux.NewRouter(withServer(doc, a.URL()))
	if err != nil {
		t.Fatal(err)
	}
	codes := documentedCodes(t, doc)
	client := &http.Client{}

	// The order the path ids name.
	orders := doc.Paths.Find("/v1/orders")
	base := baseRequest(t, "post", "/v1/orders", parameters(orders, orders.Post), orders.Post, "")
	created, _ := json.Marshal(base.body)
	res, _ := send(t, client, a.URL(), hostile{method: "POST", path: "/v1/orders", body: created,
		header: http.Header{"Idempotency-Key": {"hostile-order"}, "Content-Type": {"application/json"}}})
	if res.status != http.StatusCreated {
		t.Fatalf("creating the order: %d %s", res.status, res.body)
	}
	orderID := strings.TrimPrefix(res.header.Get("Location"), "/v1/orders/")

	// Each request as the order's tenant, then as another tenant, who must
	// learn nothing of it either.
	var reqs []hostile
	for _, tenant := range []struct{ name, key string }{{"acme", apptest.KeyAcme}, {"globex", apptest.KeyGlobex}} {
		for _, h := range generate(t, doc, orderID) {
			h.what, h.tenantKey = "as "+tenant.name+", "+h.what, tenant.key
			reqs = append(reqs, h)
		}
	}
	keys := 0
	statuses := map[int]int{}
	sent, unrouted := 0, 0
	for _, h := range reqs {
		keys++
		if h.header.Get("Idempotency-Key") == "<fresh>" {
			h.header.Set("Idempotency-Key", fmt.Sprintf("hostile-%d", keys))
		}
		ordersBefore, recordsBefore := recorded(t, a)
		first, ok := send(t, client, a.URL(), h)
		if !ok {
			continue // the Go client refuses to send it: nothing reached the service
		}
		second, _ := send(t, client, b.URL(), h)
		sent += 2
		statuses[first.status]++
		statuses[second.status]++
		fail := func(format string, args ...any) {
			t.Errorf("%s %s (%s): "+format, append([]any{h.method, cut(h.path), h.what}, args...)...)
		}
		for i, r := range []answer{first, second} {
			if r.status >= 500 {
				fail("instance %d answered %d: %s", i+1, r.status, cut(string(r.body)))
				continue
			}
			if r.status >= 400 {
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") && h.method != http.MethodHead {
					fail("a %d as %q, want application/problem+json", r.status, ct)
				}
				var p struct{ Code string }
				if err := json.Unmarshal(r.body, &p); h.method != http.MethodHead && (err != nil || !codes[p.Code]) {
					fail("a %d with code %q, not one the document lists: %s", r.status, p.Code, cut(string(r.body)))
				}
			}
		}
		if first.status != second.status {
			fail("two instances answered %d and %d", first.status, second.status)
		}
		if found, err := documented(router, h, a.URL(), first); !found {
			unrouted++
		} else if err != nil {
			fail("the answer is not one the document gives: %v", cut(err.Error()))
		}
		if refusedAsMalformed(first.status) {
			if o, r := recorded(t, a); o != ordersBefore || r != recordsBefore {
				fail("refused with %d, yet %d orders and %d records were written", first.status, o-ordersBefore, r-recordsBefore)
			}
		}
	}
	if sent < 5000 {
		t.Errorf("%d hostile requests sent, want at least 5000", sent)
	}
	t.Logf("HOSTILE: %d requests (%d generated, each to two instances; %d name no operation of the document); statuses %v",
		sent, len(reqs), unrouted, statuses)
}

func refusedAsMalformed(status int) bool {
	return slices.Contains([]int{400, 401, 405, 413, 415}, status)
}

// generate derives the hostile requests from the document.
func generate(t *testing.T, doc *openapi3.T, orderID string) (out []hostile) {
	for _, o := range operations(doc) {
		params := parameters(o.item, o.op)
		valid := baseRequest(t, o.method, o.path, params, o.op, orderID)
		var body []byte
		if valid.body != nil {
			body, _ = json.Marshal(valid.body)
		}
		hasKey := slices.ContainsFunc(params, func(p *openapi3.Parameter) bool { return p.Name == "Idempotency-Key" })
		mk := func(what, path, query string, body []byte) hostile {
			h := hostile{what: what, method: valid.method, path: path, header: http.Header{}, body: body}
			for k, v := range valid.header {
				h.header[k] = slices.Clone(v)
			}
			if hasKey {
				h.header.Set("Idempotency-Key", "<fresh>")
			}
			if body != nil {
				h.header.Set("Content-Type", "application/json")
			}
			if q := strings.TrimPrefix(query, "&"); q != "" {
				h.path += "?" + q
			}
			return h
		}
		validQuery := valid.query.Encode()
		path := strings.ReplaceAll(o.path, "{id}", orderID)

		// Query parameters, the documented ones and one the document does not name.
		names := []string{"unknown"}
		for _, p := range params {
			if p.In == "query" {
				names = append(names, p.Name)
			}
		}
		for _, name := range names {
			for _, v := range hostileQuery {
				out = append(out, mk("query "+name+"="+cut(v), path, validQuery+"&"+name+"="+v, body))
			}
			out = append(out, mk("query "+name+" twice", path, validQuery+"&"+name+"=1&"+name+"=2", body))
		}
		// The path id.
		if strings.Contains(o.path, "{id}") {
			for _, id := range hostilePathIDs {
				out = append(out, mk("path id "+cut(id), strings.ReplaceAll(o.path, "{id}", id), validQuery, body))
			}
		}
		// Headers.
		for _, name := range sortedHeaderNames() {
			if name == "Content-Type" && body == nil {
				continue
			}
			for _, v := range hostileHeaders[name] {
				h := mk("header "+name+": "+cut(v), path, validQuery, body)
				h.header.Set(name, v)
				out = append(out, h)
			}
		}
		two := mk("two Authorization headers", path, validQuery, body)
		two.twoAuth = true
		out = append(out, two)
		// The body: each field, then the whole.
		if body != nil {
			for _, field := range bodyFields(valid.body, nil) {
				for _, v := range hostileJSON {
					out = append(out, mk("body "+fieldName(field)+" = "+cut(v), path, validQuery, withRaw(t, valid.body, field, v)))
				}
			}
			for _, v := range hostileBodies {
				out = append(out, mk("body "+cut(v), path, validQuery, []byte(v)))
			}
		}
	}
	return out
}

func sortedHeaderNames() []string {
	names := make([]string, 0, len(hostileHeaders))
	for n := range hostileHeaders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// bodyFields lists the paths of every value of a JSON document.
func bodyFields(v any, path []any) (out [][]any) {
	if len(path) > 0 {
		out = append(out, slices.Clone(path))
	}
	switch x := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(x) {
			out = append(out, bodyFields(x[k], append(slices.Clone(path), k))...)
		}
	case []any:
		for i, e := range x {
			out = append(out, bodyFields(e, append(slices.Clone(path), i))...)
		}
	}
	return out
}

// withRaw is body with the value at path replaced by the raw fragment.
func withRaw(t *testing.T, body any, path []any, raw string) []byte {
	const mark = "\u0001hostile\u0001"
	b, err := json.Marshal(setAt(copyJSON(body), path, mark))
	if err != nil {
		t.Fatal(err)
	}
	quoted, _ := json.Marshal(mark)
	return bytes.Replace(b, quoted, []byte(raw), 1)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// send sends h to base; ok is false when the Go client refuses to send it.
func send(t *testing.T, client *http.Client, base string, h hostile) (answer, bool) {
	t.Helper()
	req, err := http.NewRequest(h.method, base+h.path, bytes.NewReader(h.body))
	if err != nil {
		return answer{}, false
	}
	req.Header = h.header.Clone()
	key := h.tenantKey
	if key == "" {
		key = apptest.KeyAcme
	}
	if _, set := req.Header["Authorization"]; !set {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if h.twoAuth {
		req.Header["Authorization"] = []string{"Bearer " + apptest.KeyAcme, "Bearer " + apptest.KeyGlobex}
	}
	res, err := client.Do(req)
	if err != nil {
		if strings.Contains(err.Error(), "invalid header field") || strings.Contains(err.Error(), "invalid URL") {
			return answer{}, false
		}
		t.Fatalf("%s %s: %v", h.method, cut(h.path), err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, body}, true
}

// documented checks the answer against the document: a status the
// operation lists, with the headers and body it gives that status. found is
// false when the request names no operation of the document.
func documented(router routers.Router, h hostile, base string, r answer) (found bool, err error) {
	req, err := http.NewRequest(h.method, base+h.path, bytes.NewReader(h.body))
	if err != nil {
		return false, nil
	}
	req.Header = h.header.Clone()
	route, params, err := router.FindRoute(req)
	if err != nil {
		return false, nil
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	return true, openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: r.status, Header: r.header, Body: io.NopCloser(bytes.NewReader(r.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

// documentedCodes are the problem codes the document lists.
func documentedCodes(t *testing.T, doc *openapi3.T) map[string]bool {
	s := doc.Components.Schemas["ProblemCode"]
	if s == nil || len(s.Value.Enum) == 0 {
		t.Fatal("the document lists no ProblemCode")
	}
	out := map[string]bool{}
	for _, c := range s.Value.Enum {
		out[c.(string)] = true
	}
	return out
}

func withServer(doc *openapi3.T, url string) *openapi3.T {
	doc.Servers = openapi3.Servers{{URL: url}}
	return doc
}

func cut(s string) string {
	if len(s) > 60 {
		return fmt.Sprintf("%s…(%d bytes)", s[:40], len(s))
	}
	return s
}
