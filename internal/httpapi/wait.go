package httpapi

import (
	"context"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// maxPrefer bounds a Prefer header line, as api/openapi.yaml states it.
const maxPrefer = 200

// preferredWait reads RFC 7240's `Prefer: wait=N` (whole seconds), capped by
// max. Absent, malformed or zero: no wait. Other preferences are ignored,
// as the RFC asks of preferences a server does not support; only a line
// longer than its documented bound is rejected.
func preferredWait(h []string, max time.Duration) (time.Duration, error) {
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
			return min(time.Duration(n)*time.Second, max), nil
		}
	}
	return 0, nil
}

// awaitFirst runs an idempotent operation and, when its first attempt is
// still in flight and the client asked to wait, waits (holding no
// connection) until the first attempt's outcome is stored, then asks again,
// which replays it. The wait ends with a 409 when it runs out, when the
// client hangs up, or when the service begins to stop.
func (s *Server) awaitFirst(c echo.Context, scope idempotency.Scope, wait time.Duration, run func() (idempotency.Result, error)) (idempotency.Result, error) {
	resp, err := run()
	if wait <= 0 || s.Waiter == nil || problem.CodeOf(err) != problem.RequestInProgress {
		return resp, err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), wait)
	defer cancel()
	if s.Stopping != nil {
		stop := context.AfterFunc(s.Stopping, cancel)
		defer stop()
	}
	yieldSlot(c.Request().Context()) // it waits holding neither a slot nor a connection
	for problem.CodeOf(err) == problem.RequestInProgress && s.Waiter.Await(ctx, s.DB, scope) {
		resp, err = run()
	}
	if err == nil {
		c.Response().Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
	}
	return resp, err
}
