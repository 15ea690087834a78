package order

import (
	"fmt"
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/payment"
)

func TestARefusalRepeatsOnlyAShortCodeOfTheChannel(t *testing.T) {
	for code, want := range map[string]string{
		"refund_refused":            "refund_refused",
		"":                          "refused",
		strings.Repeat("a", 65):     "refused",
		"<script>alert(1)</script>": "refused",
		"Detail with spaces":        "refused",
	} {
		err := fmt.Errorf("charge: %w", &payment.StatusError{StatusCode: 422, Code: code})
		if got := refusalReason(err); got != want {
			t.Errorf("refusalReason(code %q) = %q, want %q", code, got, want)
		}
	}
}
