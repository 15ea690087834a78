package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/payment"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 64 << 10

// idempotentOp is what differs between the idempotent POSTs.
type idempotentOp[Req comparable, Res any] struct {
	kind     opKind
	validate func(*Req) error // checks and normalises the body
	claim    func(key string, req Req) (rec *record[Req, Res], fresh bool, err error)
	complete func(*record[Req, Res])
}

func (s *Server) chargeOp() idempotentOp[payment.ChargeRequest, payment.Charge] {
	return idempotentOp[payment.ChargeRequest, payment.Charge]{
		kind: opCharge, validate: validateCharge, claim: s.store.claimCharge, complete: s.store.completeCharge,
	}
}

func (s *Server) refundOp() idempotentOp[payment.RefundRequest, payment.Refund] {
	return idempotentOp[payment.RefundRequest, payment.Refund]{
		kind: opRefund, validate: validateRefund, claim: s.store.claimRefund, complete: s.store.completeRefund,
	}
}

// serveIdempotent is the one skeleton behind POST /v1/charges and /v1/refunds.
func serveIdempotent[Req comparable, Res any](s *Server, op idempotentOp[Req, Res]) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		s.store.countPost(op.kind, key)
		if err := s.beforeRequest(ctx); err != nil {
			return err
		}
		if err := checkKey(key); err != nil {
			return err
		}
		var req Req
		if err := decodeBody(c, &req); err != nil {
			return err
		}
		if err := op.validate(&req); err != nil {
			return err
		}
		rec, fresh, err := op.claim(key, req)
		if err != nil {
			return err
		}
		if !fresh {
			// A duplicate waits for the first request to finish, then replays it.
			if err := await(ctx, rec.done); err != nil {
				return err
			}
			s.store.countReplay()
			return s.respond(c, rec.status, rec.value, true, false)
		}
		if rec.method == payment.MethodSlow {
			// A caller that leaves ends the wait but not the operation: a real
			// acquirer completes what it accepted without knowing the caller left.
			_ = sleep(ctx, s.slowDelay)
		}
		op.complete(rec)
		// pm_lost_response loses the response of the one request that acted.
		return s.respond(c, rec.status, rec.value, false, rec.method == payment.MethodLostResponse)
	}
}

// serveLookup answers GET /v1/charges and /v1/refunds?idempotency_key=K.
func serveLookup[Req comparable, Res any](s *Server, find func(key string) *record[Req, Res], notFound error) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		s.store.countLookup()
		if err := s.beforeRequest(ctx); err != nil {
			return err
		}
		key := c.QueryParam("idempotency_key")
		if key == "" {
			return fmt.Errorf("%w: the idempotency_key query parameter is required", errInvalidRequest)
		}
		rec := find(key)
		if rec == nil {
			return fmt.Errorf("%w under idempotency key %q", notFound, key)
		}
		// An operation in flight is awaited so that a lookup reports only settled outcomes.
		if err := await(ctx, rec.done); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, rec.value)
	}
}

// respond writes the outcome, or drops the connection to lose it.
func (s *Server) respond(c echo.Context, status int, body any, replayed, lose bool) error {
	if lose || s.faults.loseResponse() {
		return s.dropConnection(c)
	}
	if replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	return c.JSON(status, body)
}

// dropConnection closes the connection without writing a byte: the caller
// cannot tell whether the operation happened.
func (s *Server) dropConnection(c echo.Context) error {
	s.store.countLost()
	s.log.Info("response dropped on purpose", "path", c.Request().URL.Path,
		"idempotency_key", c.Request().Header.Get("Idempotency-Key"))
	conn, _, err := c.Response().Hijack()
	if err != nil {
		// Not hijackable (e.g. HTTP/2): aborting the handler still resets the stream.
		panic(http.ErrAbortHandler)
	}
	return conn.Close()
}

func await(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkKey applies the same key rules as the order service.
func checkKey(key string) error {
	if key == "" {
		return errKeyMissing
	}
	if len(key) > 255 {
		return errKeyInvalid
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return errKeyInvalid
		}
	}
	return nil
}

func decodeBody(c echo.Context, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), c.Request().Body, maxBodyBytes))
	if err := dec.Decode(v); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return echo.ErrStatusRequestEntityTooLarge
		}
		return fmt.Errorf("%w: body is not the expected JSON object: %v", errInvalidRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body has data after the JSON object", errInvalidRequest)
	}
	return nil
}

var knownMethods = []string{
	payment.MethodOK, payment.MethodDeclined, payment.MethodLostResponse,
	payment.MethodUnavailableOnce, payment.MethodSlow,
}

func validateCharge(r *payment.ChargeRequest) error {
	r.Currency = strings.ToUpper(r.Currency)
	switch {
	case r.Amount <= 0:
		return fmt.Errorf("%w: amount must be a positive integer in minor units", errInvalidRequest)
	case !isCurrency(r.Currency):
		return fmt.Errorf("%w: currency must be a three-letter ISO 4217 code", errInvalidRequest)
	case len(r.Reference) > 255:
		return fmt.Errorf("%w: reference must be at most 255 bytes", errInvalidRequest)
	case !slices.Contains(knownMethods, r.PaymentMethod):
		return fmt.Errorf("%w: payment_method must be one of %s", errInvalidRequest, strings.Join(knownMethods, ", "))
	}
	return nil
}

func validateRefund(r *payment.RefundRequest) error {
	switch {
	case r.ChargeID == "":
		return fmt.Errorf("%w: charge_id is required", errInvalidRequest)
	case r.Amount <= 0:
		return fmt.Errorf("%w: amount must be a positive integer in minor units", errInvalidRequest)
	}
	return nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
