package answer

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// The one table from a domain code to its HTTP status holds every code the
// contract names, each with the contract's status; anything else is a 500.
func TestEveryCodeHasTheContractsStatus(t *testing.T) {
	want := map[problem.Code]int{
		problem.InvalidRequest: 400, problem.KeyMissing: 400, problem.KeyInvalid: 400,
		problem.Unauthenticated: 401, order.CodePaymentDeclined: 402, order.CodePaymentRefused: 402,
		order.CodeNotFound: 404, problem.NotFound: 404, problem.MethodNotAllowed: 405,
		order.CodeRefundRefused: 409, problem.RequestInProgress: 409, order.CodeInvalidTransition: 409,
		problem.PayloadTooLarge: 413, problem.UnsupportedMediaType: 415, problem.KeyReused: 422,
		problem.Internal: 500, problem.ServiceUnavailable: 503,
		problem.RequestTimeout: 408, problem.QuotaExceeded: 429,
	}
	for code, status := range want {
		if got := StatusOf(code); got != status {
			t.Errorf("StatusOf(%s) = %d, want %d", code, got, status)
		}
		if codes[code].title == "" {
			t.Errorf("%s has no title", code)
		}
	}
	if len(codes) != len(want) {
		t.Errorf("the table has %d codes, the contract %d", len(codes), len(want))
	}
	if got := StatusOf("no_such_code"); got != 500 {
		t.Errorf("an unknown code is %d, want 500", got)
	}
}

// Every problem document says its detail as written: `Bearer <key>`, not
// encoding/json's HTML-escaped `Bearer \u003ckey\u003e`, and stays JSON.
func TestProblemBodiesAreNotHTMLEscaped(t *testing.T) {
	const detail = "Send a valid API key as Authorization: Bearer <key> & retry."
	for code := range codes {
		r := RenderError(problem.Errorf(code, "%s", detail).With("hint", "<a & b>"))
		if !bytes.Contains(r.Body, []byte(`"detail":"`+detail+`"`)) || !bytes.Contains(r.Body, []byte(`"hint":"<a & b>"`)) {
			t.Errorf("%s: %s", code, r.Body)
		}
		var doc map[string]any
		if err := json.Unmarshal(r.Body, &doc); err != nil || doc["detail"] != detail {
			t.Errorf("%s: not the JSON it should be (%v): %s", code, err, r.Body)
		}
		if bytes.HasSuffix(r.Body, []byte("\n")) {
			t.Errorf("%s: the body ends with a newline", code)
		}
	}
}
