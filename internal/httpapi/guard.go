package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/problem"
)

// Guard is what a request passes before the router, in this order, each
// step refusing before anything is decoded or recorded:
//
//  1. Its body must arrive within BodyTimeout of its headers: a read
//     deadline bounds every read of it from the start, and a body that
//     stalls past it is answered 408 (a slow sender costs a connection,
//     never a slot: the body is read before the request takes one).
//  2. On /v1, the tenant its API key names (an unknown key goes straight
//     to the router's 401, holding nothing), its quotas (429, quota.go)
//     and the RateLimit fields on its answer.
//  3. Its body, read whole (at most maxBody and a byte).
//  4. On /v1, a slot in its tenant's turn (503, admission.go).
func (s *Server) Guard(next http.Handler) http.Handler {
	admitted := s.Admission.Wrap(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hasBody := r.Body != nil && r.Body != http.NoBody
		if hasBody && s.BodyTimeout > 0 {
			// Unsupported only where there is no connection (a recorder).
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.BodyTimeout))
		}
		if !underV1(r.URL.Path) {
			if hasBody && !s.receiveBody(w, r, "") {
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		tenant, known := s.identify(r)
		if !known {
			next.ServeHTTP(w, r) // 401, its body unread: the deadline bounds what net/http discards
			return
		}
		s.Metrics.TenantRequest(tenant)
		release, reset, broken := s.Quotas.take(w, r, tenant, time.Now())
		if broken != "" {
			s.Metrics.Refused(tenant, string(broken), http.StatusTooManyRequests)
			return
		}
		defer release()
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, caller{tenant: tenant, reset: reset}))
		if hasBody && !s.receiveBody(w, r, tenant) {
			return
		}
		admitted.ServeHTTP(w, r)
	})
}

// caller is who Guard identified a request as: its tenant, and when its
// quota has more for it (the RateLimit field's t; 0: the bucket is full),
// so that a Retry-After on its answer is never earlier.
type caller struct {
	tenant string
	reset  time.Duration
}

type callerKey struct{}

// callerOf is who Guard identified the request as; the anonymous tenant
// "" for none.
func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// identify names the tenant whose API key the request carries. A request
// with no key, an unknown one, or more than one is no tenant's: the
// router's authenticate answers it.
func (s *Server) identify(r *http.Request) (string, bool) {
	auth := r.Header.Values(echo.HeaderAuthorization)
	if len(auth) != 1 {
		return "", false
	}
	return s.tenantOfKey(auth[0])
}

// tenantOfKey names the tenant of an Authorization header's bearer key.
func (s *Server) tenantOfKey(auth string) (string, bool) {
	scheme, key, found := strings.Cut(auth, " ")
	tenant, known := s.Tenants[sha256.Sum256([]byte(strings.TrimSpace(key)))]
	return tenant, found && known && strings.EqualFold(scheme, "Bearer")
}

// receiveBody reads r's body whole, at most maxBody and a byte (the
// handler's own bound answers 413 beyond it), and hands it to the router
// in memory. A body that stalls past its deadline is answered 408
// request_timeout and the connection closed; one that breaks off is
// answered 400. Read to its end, the deadline is lifted, so that it bounds
// no later read on the connection (net/http cancels a request's context
// when its read of the next one fails).
func (s *Server) receiveBody(w http.ResponseWriter, r *http.Request, tenant string) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.Metrics.Refused(tenant, string(RefusedBodyTimeout), http.StatusRequestTimeout)
		w.Header().Set("Connection", "close")
		writeRefusal(w, r, http.StatusRequestTimeout, 0, bodyTooSlow(s.BodyTimeout))
		return false
	case err != nil:
		writeRefusal(w, r, http.StatusBadRequest, 0,
			answer.RenderError(problem.Errorf(problem.InvalidRequest, "body: could not be read").With("field", "body")).Body)
		return false
	}
	if len(body) <= maxBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return true
}

// bodyTooSlow is the problem body of a 408.
func bodyTooSlow(d time.Duration) []byte {
	return answer.RenderError(problem.Errorf(problem.RequestTimeout,
		"The request body did not arrive within %s of its headers; nothing was recorded. Send it again, whole, with the same Idempotency-Key.", d)).Body
}
