package payment_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// newClient serves a real mock channel and returns a client for it.
func newClient(t *testing.T, opts mockchannel.Options) (*payment.Client, *mockchannel.Server) {
	t.Helper()
	srv, err := mockchannel.Open(context.Background(), testdb.Fresh(t, "payment"), opts)
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return payment.NewClient(ts.URL+"/", ts.Client()), srv
}

func chargeReq(method string) payment.ChargeRequest {
	return payment.ChargeRequest{Amount: 2500, Currency: "EUR", Reference: "order-1", PaymentMethod: method}
}

func statusErr(t *testing.T, err error) *payment.StatusError {
	t.Helper()
	se, ok := errors.AsType[*payment.StatusError](err)
	if !ok {
		t.Fatalf("error %v is not a *payment.StatusError", err)
	}
	return se
}

func TestClientCharge(t *testing.T) {
	ctx := context.Background()

	t.Run("charges and replays the charge for the same key", func(t *testing.T) {
		c, srv := newClient(t, mockchannel.Options{})
		first, err := c.Charge(ctx, "k1", chargeReq(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		if first.Replayed || first.Value.Status != payment.StatusSucceeded || first.Value.Amount != 2500 || first.Value.IdempotencyKey != "k1" {
			t.Errorf("first = %+v", first)
		}
		again, err := c.Charge(ctx, "k1", chargeReq(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		if !again.Replayed || again.Value != first.Value {
			t.Errorf("again = %+v, want a replay of %+v", again, first.Value)
		}
		if s := srv.Stats(); s.Charges != 1 || s.DuplicatesAbsorbed != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("returns a declined charge without an error", func(t *testing.T) {
		c, _ := newClient(t, mockchannel.Options{})
		res, err := c.Charge(ctx, "k1", chargeReq(payment.MethodDeclined))
		if err != nil {
			t.Fatal(err)
		}
		if res.Value.Status != payment.StatusDeclined || res.Value.ID == "" {
			t.Errorf("charge = %+v, want declined", res.Value)
		}
	})

	t.Run("reports a lost response as unavailable and replays it on retry", func(t *testing.T) {
		c, srv := newClient(t, mockchannel.Options{})
		// A first call leaves a keep-alive connection that net/http could otherwise resend on.
		if _, err := c.Charge(ctx, "warm-up", chargeReq(payment.MethodOK)); err != nil {
			t.Fatal(err)
		}
		_, err := c.Charge(ctx, "k1", chargeReq(payment.MethodLostResponse))
		if !errors.Is(err, payment.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if recs := srv.Charges(); len(recs) != 2 || recs[1].Requests != 1 {
			t.Fatalf("charges = %+v, want k1 charged after exactly one request", recs)
		}
		retry, err := c.Charge(ctx, "k1", chargeReq(payment.MethodLostResponse))
		if err != nil {
			t.Fatal(err)
		}
		found, err := c.LookupCharge(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if !retry.Replayed || retry.Value != found {
			t.Errorf("retry = %+v, lookup = %+v", retry, found)
		}
		if s := srv.Stats(); s.Charges != 2 || s.LostResponses != 1 || s.DuplicatesAbsorbed != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("reports the first pm_unavailable_once attempt as unavailable", func(t *testing.T) {
		c, srv := newClient(t, mockchannel.Options{})
		_, err := c.Charge(ctx, "k1", chargeReq(payment.MethodUnavailableOnce))
		if !errors.Is(err, payment.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if se := statusErr(t, err); se.StatusCode != http.StatusServiceUnavailable || se.Code != "service_unavailable" || se.RetryAfter != time.Second {
			t.Errorf("status error = %+v", se)
		}
		res, err := c.Charge(ctx, "k1", chargeReq(payment.MethodUnavailableOnce))
		if err != nil {
			t.Fatal(err)
		}
		if res.Replayed || res.Value.Status != payment.StatusSucceeded {
			t.Errorf("retry = %+v, want a fresh charge", res)
		}
		if s := srv.Stats(); s.Charges != 1 || s.UnavailableResponses != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("rejects the same key with other parameters", func(t *testing.T) {
		c, _ := newClient(t, mockchannel.Options{})
		if _, err := c.Charge(ctx, "k1", chargeReq(payment.MethodOK)); err != nil {
			t.Fatal(err)
		}
		other := chargeReq(payment.MethodOK)
		other.Amount++
		_, err := c.Charge(ctx, "k1", other)
		if !errors.Is(err, payment.ErrRejected) || statusErr(t, err).Code != "idempotency_key_reused" {
			t.Errorf("err = %v, want ErrRejected idempotency_key_reused", err)
		}
	})

	t.Run("rejects an invalid request", func(t *testing.T) {
		c, _ := newClient(t, mockchannel.Options{})
		_, err := c.Charge(ctx, "k1", chargeReq("pm_unknown"))
		if !errors.Is(err, payment.ErrRejected) || statusErr(t, err).StatusCode != http.StatusBadRequest {
			t.Errorf("err = %v, want ErrRejected 400", err)
		}
	})

	t.Run("reports a timeout as unavailable", func(t *testing.T) {
		// The deadline leaves the request time to reach the channel's ledger
		// on a loaded machine (20ms did not), and ends well before the answer.
		c, srv := newClient(t, mockchannel.Options{SlowDelay: 5 * time.Second})
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Charge(tctx, "k1", chargeReq(payment.MethodSlow))
		if !errors.Is(err, payment.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrUnavailable wrapping DeadlineExceeded", err)
		}
		// The channel still charged: the lookup reports the real outcome.
		found, err := c.LookupCharge(ctx, "k1")
		if err != nil || found.Status != payment.StatusSucceeded {
			t.Errorf("lookup = %+v, %v", found, err)
		}
		if s := srv.Stats(); s.Charges != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("reports a refused connection as unavailable", func(t *testing.T) {
		ts := httptest.NewServer(http.NotFoundHandler())
		ts.Close()
		_, err := payment.NewClient(ts.URL, nil).Charge(ctx, "k1", chargeReq(payment.MethodOK))
		if !errors.Is(err, payment.ErrUnavailable) {
			t.Errorf("err = %v, want ErrUnavailable", err)
		}
	})

	t.Run("reports 5xx and 429 as unavailable and other 4xx as rejected", func(t *testing.T) {
		for status, want := range map[int]error{
			http.StatusInternalServerError: payment.ErrUnavailable,
			http.StatusBadGateway:          payment.ErrUnavailable,
			http.StatusTooManyRequests:     payment.ErrUnavailable,
			http.StatusConflict:            payment.ErrUnavailable,
			http.StatusBadRequest:          payment.ErrRejected,
			http.StatusUnprocessableEntity: payment.ErrRejected,
			http.StatusNotFound:            payment.ErrRejected, // on a POST; a lookup's 404 is ErrNotFound
		} {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(status)
				_, _ = w.Write([]byte("plain failure"))
			}))
			_, err := payment.NewClient(ts.URL, ts.Client()).Charge(ctx, "k1", chargeReq(payment.MethodOK))
			ts.Close()
			if !errors.Is(err, want) {
				t.Errorf("%d: err = %v, want %v", status, err, want)
			} else if se := statusErr(t, err); se.Detail != "plain failure" {
				t.Errorf("%d: detail = %q", status, se.Detail)
			}
		}
	})
}

func TestClientLookupCharge(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, mockchannel.Options{})

	t.Run("answers ErrNotFound for a key never charged", func(t *testing.T) {
		if _, err := c.LookupCharge(ctx, "unknown"); !errors.Is(err, payment.ErrNotFound) {
			t.Errorf("err = %v, want ErrNotFound", err)
		}
	})

	t.Run("finds the charge made under the key", func(t *testing.T) {
		made, err := c.Charge(ctx, "k/with?odd&chars", chargeReq(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		found, err := c.LookupCharge(ctx, "k/with?odd&chars")
		if err != nil || found != made.Value {
			t.Errorf("lookup = %+v, %v; want %+v", found, err, made.Value)
		}
	})
}

// What an answer that is not the definitive one means, for a POST and for
// a lookup by key: only a POST can be refused; a lookup finds the charge,
// finds nothing (404), or tells nothing.
func TestStatusErrorClassifiesByMethod(t *testing.T) {
	for _, c := range []struct {
		status       int
		code         string
		post, lookup error
	}{
		{400, "", payment.ErrRejected, payment.ErrUnavailable},
		{403, "", payment.ErrRejected, payment.ErrUnavailable},
		{404, payment.CodeChargeNotFound, payment.ErrRejected, payment.ErrNotFound},
		{404, payment.CodeRefundNotFound, payment.ErrRejected, payment.ErrNotFound},
		{404, "not_found", payment.ErrRejected, payment.ErrUnavailable}, // a wrong path, a gateway: no proof there is none
		{404, "", payment.ErrRejected, payment.ErrUnavailable},
		{409, "", payment.ErrUnavailable, payment.ErrUnavailable},
		{410, "", payment.ErrRejected, payment.ErrUnavailable},
		{422, "", payment.ErrRejected, payment.ErrUnavailable},
		{429, "", payment.ErrUnavailable, payment.ErrUnavailable},
		{502, "", payment.ErrUnavailable, payment.ErrUnavailable},
	} {
		if err := (&payment.StatusError{StatusCode: c.status, Code: c.code}); !errors.Is(err, c.post) {
			t.Errorf("POST answered %d %q: %v, want %v", c.status, c.code, errors.Unwrap(err), c.post)
		}
		if err := (&payment.StatusError{StatusCode: c.status, Code: c.code, Lookup: true}); !errors.Is(err, c.lookup) {
			t.Errorf("lookup answered %d %q: %v, want %v", c.status, c.code, errors.Unwrap(err), c.lookup)
		}
	}
}

func TestClientRefund(t *testing.T) {
	ctx := context.Background()
	c, srv := newClient(t, mockchannel.Options{})
	charge, err := c.Charge(ctx, "charge-key", chargeReq(payment.MethodLostResponse))
	if err == nil {
		t.Fatalf("charge response arrived: %+v", charge)
	}
	ch, err := c.LookupCharge(ctx, "charge-key")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("loses the first refund response and replays it on retry", func(t *testing.T) {
		req := payment.RefundRequest{ChargeID: ch.ID, Amount: 1000}
		if _, err := c.Refund(ctx, "r1", req); !errors.Is(err, payment.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		res, err := c.Refund(ctx, "r1", req)
		if err != nil {
			t.Fatal(err)
		}
		found, err := c.LookupRefund(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if !res.Replayed || res.Value != found || found.Amount != 1000 || found.ChargeID != ch.ID {
			t.Errorf("refund = %+v, lookup = %+v", res, found)
		}
	})

	t.Run("rejects a refund beyond what remains", func(t *testing.T) {
		_, err := c.Refund(ctx, "r2", payment.RefundRequest{ChargeID: ch.ID, Amount: 1501})
		if !errors.Is(err, payment.ErrRejected) || statusErr(t, err).Code != "refund_invalid" {
			t.Errorf("err = %v, want ErrRejected refund_invalid", err)
		}
	})

	t.Run("refuses a refund of an unknown charge, and finds no refund under an unknown key", func(t *testing.T) {
		if _, err := c.Refund(ctx, "r3", payment.RefundRequest{ChargeID: "ch_unknown", Amount: 1}); !errors.Is(err, payment.ErrRejected) {
			t.Errorf("refund err = %v, want ErrRejected", err)
		}
		if _, err := c.LookupRefund(ctx, "unknown"); !errors.Is(err, payment.ErrNotFound) {
			t.Errorf("lookup err = %v, want ErrNotFound", err)
		}
	})

	if s := srv.Stats(); s.Refunds != 1 || s.AmountRefunded != 1000 || s.LostResponses != 2 {
		t.Errorf("stats = %+v", s)
	}
}
