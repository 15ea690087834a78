package mockchannel

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
type idempotentOp[Req, Res any] struct {
	kind     opKind
	validate func(*Req) error // checks and normalises the body
	// claim replays the outcome recorded under the post's key, or makes and
	// records it, counting the post with it.
	claim func(ctx context.Context, p *post, req Req) (outcome[Res], error)
}

func (s *Server) chargeOp() idempotentOp[payment.ChargeRequest, payment.Charge] {
	return idempotentOp[payment.ChargeRequest, payment.Charge]{kind: opCharge, validate: validateCharge, claim: s.store.claimCharge}
}

func (s *Server) refundOp() idempotentOp[payment.RefundRequest, payment.Refund] {
	return idempotentOp[payment.RefundRequest, payment.Refund]{kind: opRefund, validate: validateRefund, claim: s.store.claimRefund}
}

// serveIdempotent is the one skeleton behind POST /v1/charges and /v1/refunds.
func serveIdempotent[Req, Res any](s *Server, op idempotentOp[Req, Res]) echo.HandlerFunc {
	return func(c echo.Context) error {
		// A real acquirer completes and records what it accepted without
		// knowing the caller left: the ledger's writes outlive the request.
		work := context.WithoutCancel(c.Request().Context())
		key := c.Request().Header.Get("Idempotency-Key")
		keyErr := checkKey(key)
		p := &post{kind: op.kind}
		if keyErr == nil {
			p.key = key
		}
		err := servePost(s, c, op, p, keyErr)
		// A POST that had no effect to be counted with is counted now,
		// before echo writes its error.
		if cerr := s.store.countPost(work, p); cerr != nil {
			if err == nil {
				return cerr
			}
			s.log.Error("counting a request", "err", cerr)
		}
		return err
	}
}

// servePost runs one POST up to its answer; what had an effect counted the
// post with it, and serveIdempotent counts the rest.
func servePost[Req, Res any](s *Server, c echo.Context, op idempotentOp[Req, Res], p *post, keyErr error) error {
	ctx := c.Request().Context()
	work := context.WithoutCancel(ctx)
	if err := s.beforeRequest(ctx); err != nil {
		return err
	}
	if keyErr != nil {
		return keyErr
	}
	var req Req
	if err := decodeBody(c, &req); err != nil {
		return err
	}
	if err := op.validate(&req); err != nil {
		return err
	}
	out, err := op.claim(work, p, req)
	if err != nil {
		return err
	}
	if !out.fresh {
		if err := s.store.countReplay(work, p); err != nil {
			return err
		}
		return s.respond(c, out.status, out.value, true, false)
	}
	if out.method == payment.MethodSlow {
		// A caller that leaves ends the wait but not the operation, which
		// is already in the ledger.
		_ = sleep(ctx, s.slowDelay)
	}
	// pm_lost_response loses the response of the one request that acted;
	// every later one is a replay, so a restart cannot lose it again.
	return s.respond(c, out.status, out.value, false, out.method == payment.MethodLostResponse)
}

// serveLookup answers GET /v1/charges and /v1/refunds?idempotency_key=K.
func serveLookup[Res any](s *Server, find func(ctx context.Context, key string) (Res, bool, error), notFound error) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		if err := s.store.count(context.WithoutCancel(ctx), counterLookups); err != nil {
			return err
		}
		if err := s.beforeRequest(ctx); err != nil {
			return err
		}
		key := c.QueryParam("idempotency_key")
		if key == "" {
			return fmt.Errorf("%w: the idempotency_key query parameter is required", errInvalidRequest)
		}
		// Charges and refunds are written whole, so a lookup sees an outcome,
		// or a charge taken on as pending until it settles.
		value, found, err := find(ctx, key)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w under idempotency key %q", notFound, key)
		}
		return c.JSON(http.StatusOK, value)
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
	if err := s.store.count(context.WithoutCancel(c.Request().Context()), counterLost); err != nil {
		return err
	}
	s.log.Info("response dropped on purpose", "path", c.Request().URL.Path,
		"idempotency_key", c.Request().Header.Get("Idempotency-Key"))
	conn, _, err := c.Response().Hijack()
	if err != nil {
		// Not hijackable (e.g. HTTP/2): aborting the handler still resets the stream.
		panic(http.ErrAbortHandler)
	}
	return conn.Close()
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

// knownMethods are the service's test tokens and those the channel settles later.
var knownMethods = slices.Concat(payment.Methods, payment.AsyncMethods)

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
