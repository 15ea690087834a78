package order

import (
	"bytes"
	"encoding/json"
	"math/big"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// FuzzCreateFingerprint checks the canonical form that create fingerprints:
// a request and the same purchase written differently (items shuffled,
// whitespace around strings, a lower-case currency, the JSON re-encoded with
// other key order and spacing, a client_trace_id added) are accepted or
// rejected alike and, when accepted, hash equal; changing one business field
// always changes the hash.
func FuzzCreateFingerprint(f *testing.F) {
	f.Add("cus_1", "EUR", "SKU-1", "SKU-2", "SKU-3", 2, 1, 1, int64(1250), int64(99), int64(0), "channel", "web", uint8(2), uint64(1))
	f.Add(" cus_1 ", "eur", "SKU-1", "SKU-1", "SKU-1", 1, 1, 2, int64(5), int64(5), int64(5), "", "", uint8(7), uint64(2))
	f.Add("客户-ü", "usd", "商品", "sku 2", "\u00a0x", 1000, 1000, 1, int64(1)<<40, int64(1)<<30, int64(7), "k", "", uint8(4), uint64(3))
	f.Add("c", "EUR", "A", "B", "C", 4, 1, 1, int64(1)<<62, int64(1), int64(1), "", "", uint8(0), uint64(4))
	f.Add("c", "JPY", "A", "B", "C", 1, 1, 1, int64(9223372036854775807), int64(1), int64(0), "", "", uint8(1), uint64(5))
	f.Add("", "EURO", "", "B\x7f", "C\n", 0, -1, 1001, int64(-1), int64(1), int64(1), "k\x00", "v", uint8(2), uint64(6))
	f.Fuzz(func(t *testing.T, customer, currency, sku1, sku2, sku3 string, q1, q2, q3 int, p1, p2, p3 int64,
		metaKey, metaValue string, items uint8, seed uint64) {
		// JSON carries only valid UTF-8; anything else arrives as U+FFFD.
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
		base := []ItemRequest{{valid(sku1), q1, p1}, {valid(sku2), q2, p2}, {valid(sku3), q3, p3}}
		r := CreateRequest{CustomerID: valid(customer), Currency: valid(currency)}
		for i := range 1 + int(items)%8 {
			r.Items = append(r.Items, base[i%len(base)])
		}
		if metaKey != "" {
			r.Metadata = map[string]string{valid(metaKey): valid(metaValue)}
		}
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

		n1, total1, err1 := r.normalize()
		other := equivalent(t, rng, r)
		n2, total2, err2 := other.normalize()
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("the same purchase written differently is judged differently:\n%+v -> %v\n%+v -> %v", r, err1, other, err2)
		}
		if err1 != nil {
			if problem.CodeOf(err1) != problem.InvalidRequest || problem.CodeOf(err2) != problem.InvalidRequest {
				t.Fatalf("rejections are not invalid_request: %v / %v", err1, err2)
			}
			return
		}
		fp1, fp2 := fingerprint(t, n1), fingerprint(t, n2)
		if fp1 != fp2 || total1 != total2 || !reflect.DeepEqual(n1, n2) {
			t.Fatalf("equal purchases hash differently:\n%+v %d %s\n%+v %d %s", n1, total1, fp1, n2, total2, fp2)
		}
		checkCanonical(t, n1, total1)
		again, _, err := n1.normalize()
		if err != nil || fingerprint(t, again) != fp1 {
			t.Fatalf("the canonical form is not a fixed point: %+v -> %+v (%v)", n1, again, err)
		}

		for name, change := range businessChanges(n1, rng) {
			changed, _, err := change.normalize()
			if err != nil {
				continue // e.g. quantity 1000+1, or a total that now overflows
			}
			if fingerprint(t, changed) == fp1 {
				t.Fatalf("changing the %s leaves the fingerprint unchanged:\n%+v\n%+v", name, n1, changed)
			}
		}
	})
}

func fingerprint(t *testing.T, n CreateRequest) string {
	t.Helper()
	fp, err := idempotency.Fingerprint(OpCreate, "", n)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// equivalent writes r the way another client, or a retry through another
// library, might: same business content, different bytes.
func equivalent(t *testing.T, rng *rand.Rand, r CreateRequest) CreateRequest {
	t.Helper()
	pad := func(s string) string {
		spaces := []string{"", " ", "\t", "\n", "  \r\n", "\u00a0", "\u3000"}
		return spaces[rng.IntN(len(spaces))] + s + spaces[rng.IntN(len(spaces))]
	}
	items := make([]any, len(r.Items))
	for i, it := range r.Items {
		items[i] = map[string]any{"sku": pad(it.SKU), "quantity": it.Quantity, "unit_price": it.UnitPrice}
	}
	rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	currency := r.Currency
	if isASCII(currency) { // case folding is an equivalence for ASCII letters only
		var b strings.Builder
		for _, c := range strings.ToLower(currency) {
			if rng.IntN(2) == 0 {
				c = []rune(strings.ToUpper(string(c)))[0]
			}
			b.WriteRune(c)
		}
		currency = b.String()
	}
	doc := map[string]any{
		"customer_id":     pad(r.CustomerID),
		"currency":        pad(currency),
		"items":           items,
		"client_trace_id": "trace-" + string(rune('a'+rng.IntN(26))),
	}
	switch {
	case len(r.Metadata) > 0:
		m := map[string]any{}
		for k, v := range r.Metadata {
			m[k] = v
		}
		doc["metadata"] = m
	case rng.IntN(2) == 0:
		doc["metadata"] = map[string]any{}
	}
	var out CreateRequest
	dec := json.NewDecoder(bytes.NewReader(writeJSON(rng, doc)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("re-encoded request does not decode: %v", err)
	}
	return out
}

// writeJSON encodes v with object keys in random order and random spacing
// between tokens.
func writeJSON(rng *rand.Rand, v any) []byte {
	var b bytes.Buffer
	space := func() { b.WriteString([]string{"", " ", "\n\t", "  ", "\r\n "}[rng.IntN(5)]) }
	var value func(any)
	value = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				space()
				value(k)
				space()
				b.WriteByte(':')
				space()
				value(v[k])
			}
			space()
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				space()
				value(e)
			}
			space()
			b.WriteByte(']')
		default:
			enc, _ := json.Marshal(v)
			b.Write(enc)
		}
	}
	space()
	value(v)
	space()
	return b.Bytes()
}

// businessChanges returns copies of the canonical request n, each with one
// business field changed.
func businessChanges(n CreateRequest, rng *rand.Rand) map[string]CreateRequest {
	clone := func() CreateRequest {
		c := n
		c.Items = slices.Clone(n.Items)
		if n.Metadata != nil {
			c.Metadata = map[string]string{}
			for k, v := range n.Metadata {
				c.Metadata[k] = v
			}
		}
		return c
	}
	j := rng.IntN(len(n.Items))
	out := map[string]CreateRequest{}

	c := clone()
	if c.Items[j].Quantity < maxQuantity {
		c.Items[j].Quantity++
	} else {
		c.Items[j].Quantity--
	}
	out["quantity"] = c

	c = clone()
	if c.Items[j].SKU = "SKU-CHANGED"; n.Items[j].SKU == c.Items[j].SKU {
		c.Items[j].SKU = "SKU-CHANGED-2"
	}
	out["sku"] = c

	c = clone()
	if c.Items[j].UnitPrice > 0 {
		c.Items[j].UnitPrice--
	} else {
		c.Items[j].UnitPrice++
	}
	out["unit price"] = c

	c = clone()
	c.CustomerID = n.CustomerID + "2"
	out["customer"] = c

	c = clone()
	c.Currency = map[bool]string{true: "USD", false: "EUR"}[n.Currency == "EUR"]
	out["currency"] = c

	if len(n.Items) > 1 {
		c = clone()
		c.Items = slices.Delete(c.Items, j, j+1)
		out["number of items"] = c
	}

	c = clone()
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	c.Metadata["fuzz-extra"] = "x"
	out["metadata"] = c
	return out
}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// checkCanonical asserts what the schema and the fingerprint rely on: the
// canonical form fits every column constraint and the total is the exact sum.
func checkCanonical(t *testing.T, n CreateRequest, total int64) {
	t.Helper()
	if !currencyPattern.MatchString(n.Currency) {
		t.Fatalf("canonical currency %q", n.Currency)
	}
	text := func(s string, max int) bool {
		return s != "" && s == strings.TrimSpace(s) && utf8.RuneCountInString(s) <= max && utf8.ValidString(s)
	}
	if !text(n.CustomerID, 100) || n.ClientTraceID != "" || len(n.Items) < 1 || len(n.Items) > maxItems {
		t.Fatalf("canonical request out of bounds: %+v", n)
	}
	sum := new(big.Int)
	for i, it := range n.Items {
		if !text(it.SKU, 64) || it.Quantity < 1 || it.Quantity > maxQuantity || it.UnitPrice < 0 || it.UnitPrice > maxUnitPrice {
			t.Fatalf("canonical item out of bounds: %+v", it)
		}
		if i > 0 && itemLess(it, n.Items[i-1]) {
			t.Fatalf("items are not sorted: %+v", n.Items)
		}
		sum.Add(sum, new(big.Int).Mul(big.NewInt(it.UnitPrice), big.NewInt(int64(it.Quantity))))
	}
	if !sum.IsInt64() || sum.Int64() != total {
		t.Fatalf("total = %d, exact sum = %s", total, sum)
	}
	if n.Metadata != nil && len(n.Metadata) == 0 {
		t.Fatalf("empty metadata is not canonicalised to absent")
	}
}

func itemLess(a, b ItemRequest) bool {
	if a.SKU != b.SKU {
		return a.SKU < b.SKU
	}
	if a.UnitPrice != b.UnitPrice {
		return a.UnitPrice < b.UnitPrice
	}
	return a.Quantity < b.Quantity
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
