package mockchannel

// Webhook delivery: one loop per channel process sends the outbox's due
// events to the webhook URL, signed as Standard Webhooks prescribes, until
// the receiver answers 2xx; a failure is retried with exponential backoff
// and jitter until the retry window ends. Delivery is at least once and in
// no guaranteed order, as a real acquirer's is.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/orderservice/orderservice/internal/webhook"
)

// maxWebhookBackoff caps the wait between two attempts.
const maxWebhookBackoff = 6 * time.Hour

// sender delivers the outbox to one URL.
type sender struct {
	url        string
	secret     string
	client     *http.Client
	timeout    time.Duration
	window     time.Duration
	firstRetry time.Duration
	store      *store
	faults     *faultInjector
	log        *slog.Logger
}

func newSender(opts Options, st *store, faults *faultInjector, log *slog.Logger) *sender {
	timeout := positiveOr(opts.WebhookTimeout, DefaultWebhookTimeout)
	return &sender{
		url:    opts.WebhookURL,
		secret: opts.WebhookSecret,
		client: &http.Client{Timeout: timeout,
			// A client span per delivery; the receiver's span joins its trace.
			Transport: otelhttp.NewTransport(http.DefaultTransport,
				otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return "webhook deliver" })),
			// A redirect is a failure (Standard Webhooks): the URL is to be fixed, not followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		timeout:    timeout,
		window:     positiveOr(opts.WebhookRetryWindow, DefaultWebhookRetryWindow),
		firstRetry: positiveOr(opts.WebhookFirstRetry, DefaultWebhookFirstRetry),
		store:      st,
		faults:     faults,
		log:        log,
	}
}

// attempt is how one request went.
type attempt struct {
	status     int           // 0: no HTTP answer
	retryAfter time.Duration // the receiver's Retry-After
	detail     string        // the start of a non-2xx answer, or the network's error
}

func (a attempt) delivered() bool { return a.status >= 200 && a.status < 300 }

// failure says why the attempt failed.
func (a attempt) failure() string {
	if a.status != 0 {
		return strings.TrimSpace(fmt.Sprintf("HTTP %d %s", a.status, a.detail))
	}
	return a.detail
}

// pass delivers every event due and says when the next falls due.
func (w *sender) pass(ctx context.Context) (time.Time, error) {
	for ctx.Err() == nil {
		// The lease outlasts the attempt: only a stop or a crash leaves the
		// event claimed, and then it is due again when the lease ends.
		ev, found, err := w.store.claimDelivery(ctx, 2*w.timeout)
		if err != nil {
			return time.Time{}, err
		}
		if !found {
			break
		}
		if err := w.deliver(ctx, ev); err != nil {
			return time.Time{}, err
		}
	}
	return w.store.nextDelivery(ctx)
}

// deliver makes one attempt at ev, with the faults in force, and records it.
func (w *sender) deliver(ctx context.Context, ev outboxEvent) error {
	a := attempt{detail: "dropped on the way (injected fault)"}
	if !w.faults.dropWebhook() {
		a = w.send(ctx, ev)
	}
	n := ev.Attempts + 1
	if a.delivered() {
		sends := 1
		if w.faults.duplicateWebhook() {
			w.send(ctx, ev) // the receiver sees the event twice; its answer changes nothing
			sends++
		}
		w.log.Debug("webhook delivered", "id", ev.ID, "type", ev.Type, "attempt", n, "status", a.status)
		// Recorded even while stopping, so that it is not sent again.
		return w.store.recordDelivered(context.WithoutCancel(ctx), ev.ID, sends, a.status)
	}
	if ctx.Err() != nil {
		return nil // stopping cut the attempt short: the lease brings the event back, as after a crash
	}
	retryIn := backoff(n, w.firstRetry, a.retryAfter)
	giveUp := time.Now().Add(retryIn).After(ev.CreatedAt.Add(w.window))
	if giveUp {
		w.log.Warn("webhook given up: its retry window has ended", "id", ev.ID, "type", ev.Type, "attempts", n,
			"window", w.window, "last", a.failure())
	} else {
		w.log.Info("webhook attempt failed", "id", ev.ID, "type", ev.Type, "attempt", n, "failure", a.failure(),
			"retry_in", retryIn)
	}
	return w.store.recordFailure(ctx, ev.ID, a, retryIn, giveUp)
}

// send POSTs ev once, signed for this attempt's timestamp.
func (w *sender) send(ctx context.Context, ev outboxEvent) attempt {
	now := time.Now()
	sig, err := webhook.Sign(w.secret, ev.ID, now, []byte(ev.Body))
	if err != nil { // Open checked the secret; an id is never refused
		return attempt{detail: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, strings.NewReader(ev.Body))
	if err != nil {
		return attempt{detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderID, ev.ID)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(webhook.HeaderSignature, sig)
	resp, err := w.client.Do(req)
	if err != nil {
		return attempt{detail: err.Error()}
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyBytes)) // so the connection is reused
	a := attempt{status: resp.StatusCode}
	if !a.delivered() {
		a.detail = string(bytes.TrimSpace(answer))
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		a.retryAfter = time.Duration(secs) * time.Second
	}
	return a
}

// backoff is the wait after the nth failed attempt: first, doubled for each
// attempt after the first, capped, then jittered to between half and all of
// that so that retries spread out; never less than the receiver's
// Retry-After, itself capped.
func backoff(n int, first, retryAfter time.Duration) time.Duration {
	d := first
	for i := 1; i < n && d < maxWebhookBackoff; i++ {
		d *= 2
	}
	d = min(d, maxWebhookBackoff)
	d = d/2 + rand.N(d/2+1)
	return min(max(d, retryAfter), maxWebhookBackoff)
}

// resend sends the event under id again now, as an acquirer's dashboard
// does, whatever its state: the receiver must take it as a duplicate.
func (w *sender) resend(ctx context.Context, id string) (Delivery, error) {
	ev, found, err := w.store.eventByID(ctx, id)
	if err != nil {
		return Delivery{}, err
	}
	if !found {
		return Delivery{}, fmt.Errorf("%w: no event %q", errWebhookNotFound, id)
	}
	a := w.send(ctx, ev)
	if a.delivered() {
		err = w.store.recordDelivered(ctx, id, 1, a.status)
	} else {
		err = w.store.recordResendFailure(ctx, id, a)
	}
	if err != nil {
		return Delivery{}, err
	}
	return w.store.delivery(ctx, id)
}

// Webhooks lists the webhook outbox, oldest event first. Like Charges it is
// for tests: a database error is logged and yields no deliveries.
func (s *Server) Webhooks() []Delivery {
	ctx, cancel := context.WithTimeout(context.Background(), directTimeout)
	defer cancel()
	ds, err := s.store.deliveries(ctx)
	if err != nil {
		s.log.Error("listing webhooks", "err", err)
	}
	return ds
}

func (s *Server) adminWebhooks(c echo.Context) error {
	ds, err := s.store.deliveries(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string][]Delivery{"webhooks": ds})
}

func (s *Server) adminResendWebhook(c echo.Context) error {
	if s.webhooks == nil {
		return fmt.Errorf("%w: the channel has no webhook URL", errWebhooksOff)
	}
	// The attempt is recorded even if the operator's request is gone.
	d, err := s.webhooks.resend(context.WithoutCancel(c.Request().Context()), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}
