package httpapi

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/orderservice/orderservice/internal/problem"
)

// maxPrefer bounds a Prefer header line, as api/openapi.yaml states it.
const maxPrefer = 200

// preferredWait reads RFC 7240's `Prefer: wait=N` (whole seconds), as the
// use case's order.Door.Wait (which the service caps). Absent, malformed
// or zero: no wait. Other preferences are ignored, as the RFC asks of
// preferences a server does not support; only a line longer than its
// documented bound is rejected.
func preferredWait(h []string) (time.Duration, error) {
	for _, line := range h {
		if utf8.RuneCountInString(line) > maxPrefer {
			return 0, problem.Errorf(problem.InvalidRequest, "Prefer: must be at most %d characters", maxPrefer).With("field", "Prefer")
		}
	}
	for _, line := range h {
		for pref := range strings.SplitSeq(line, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(strings.SplitN(pref, ";", 2)[0]), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseUint(strings.Trim(strings.TrimSpace(value), `"`), 10, 31)
			if err != nil {
				return 0, nil
			}
			return time.Duration(n) * time.Second, nil
		}
	}
	return 0, nil
}
