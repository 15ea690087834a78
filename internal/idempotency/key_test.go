package idempotency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		raw, want string
		code      problem.Code
	}{
		{"R1", "R1", ""},
		{`"R1"`, "R1", ""},
		{`"a\"b"`, `a"b`, ""},
		{`"a\\b"`, `a\b`, ""},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), ""},
		{"", "", problem.KeyMissing},
		{`""`, "", problem.KeyInvalid},
		{strings.Repeat("k", 256), "", problem.KeyInvalid},
		{"a b", "", problem.KeyInvalid},
		{"a\tb", "", problem.KeyInvalid},
		{"ключ", "", problem.KeyInvalid},
		{"a\u200bb", "", problem.KeyInvalid},
		{`"a"b"`, "", problem.KeyInvalid},
		{`"a\nb"`, "", problem.KeyInvalid},
	} {
		got, err := idempotency.ParseKey(tc.raw)
		if tc.code == "" && (err != nil || got != tc.want) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
		if tc.code != "" && problem.CodeOf(err) != tc.code {
			t.Errorf("ParseKey(%q) err = %v; want %s", tc.raw, err, tc.code)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"R1", `"R1"`, `"a\"b"`, "", " ", strings.Repeat("x", 300), "\x00", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := idempotency.ParseKey(raw)
		if err != nil {
			if c := problem.CodeOf(err); c != problem.KeyMissing && c != problem.KeyInvalid {
				t.Fatalf("unexpected error code %s", c)
			}
			return
		}
		if len(key) < 1 || len(key) > idempotency.MaxKeyLength {
			t.Fatalf("accepted a key of length %d", len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("accepted byte %#x", key[i])
			}
		}
		if again, err := idempotency.ParseKey(key); !strings.ContainsAny(key, `"\`) && (err != nil || again != key) {
			t.Fatalf("a parsed key does not parse to itself: %q -> %q, %v", key, again, err)
		}
	})
}

func TestFingerprint(t *testing.T) {
	type fields struct {
		A string
		M map[string]string
	}
	a, _ := idempotency.Fingerprint("op", "r", fields{A: "x", M: map[string]string{"k1": "1", "k2": "2"}})
	b, _ := idempotency.Fingerprint("op", "r", fields{A: "x", M: map[string]string{"k2": "2", "k1": "1"}})
	if a != b || len(a) != 64 {
		t.Fatalf("map order changed the fingerprint: %s %s", a, b)
	}
	for name, other := range map[string][3]any{
		"operation": {"op2", "r", fields{A: "x", M: map[string]string{"k1": "1", "k2": "2"}}},
		"resource":  {"op", "r2", fields{A: "x", M: map[string]string{"k1": "1", "k2": "2"}}},
		"fields":    {"op", "r", fields{A: "y", M: map[string]string{"k1": "1", "k2": "2"}}},
	} {
		c, _ := idempotency.Fingerprint(other[0].(string), other[1].(string), other[2])
		if c == a {
			t.Errorf("another %s gives the same fingerprint", name)
		}
	}
}

func TestPolicy(t *testing.T) {
	p := idempotency.Policy{
		Windows: []idempotency.Window{
			{Name: "client_retry", Duration: 24 * time.Hour},
			{Name: "message_redelivery", Duration: 7 * 24 * time.Hour},
			{Name: "manual_compensation", Duration: 30 * 24 * time.Hour},
		},
		Margin: 24 * time.Hour, MoneyFloor: 90 * 24 * time.Hour, MoneyOperations: []string{"order.pay"},
	}
	t.Run("retention is the longest replay window plus the margin", func(t *testing.T) {
		if got := p.RetentionFor("order.create"); got != 31*24*time.Hour {
			t.Errorf("retention = %s", got)
		}
	})
	t.Run("money operations keep the longer floor", func(t *testing.T) {
		if got := p.RetentionFor("order.pay"); got != 90*24*time.Hour {
			t.Errorf("retention = %s", got)
		}
	})
	t.Run("one day is refused, naming the window that makes it unsafe", func(t *testing.T) {
		p.Retention = 24 * time.Hour
		err := p.Check()
		if err == nil || !strings.Contains(err.Error(), "manual_compensation") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("a negative margin is refused, whatever else is set", func(t *testing.T) {
		for _, retention := range []time.Duration{0, 40 * 24 * time.Hour} {
			q := p
			q.Retention, q.Margin = retention, -58*time.Second
			if err := q.Check(); err == nil || !strings.Contains(err.Error(), "margin") {
				t.Errorf("retention %s, margin -58s: err = %v", retention, err)
			}
		}
	})
	t.Run("a retention covering every window is accepted", func(t *testing.T) {
		p.Retention = 40 * 24 * time.Hour
		if err := p.Check(); err != nil || p.RetentionFor("order.create") != 40*24*time.Hour {
			t.Errorf("err = %v", err)
		}
	})
}
