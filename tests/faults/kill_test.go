//go:build faults

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/orderservice/orderservice/client"
)

// moneyIntent is one pay or cancel (refund) sent to the instance that dies.
type moneyIntent struct {
	op      string // "pay" or "cancel"
	orderID string
	key     string
}

func (m moneyIntent) path() string { return "/v1/orders/" + m.orderID + "/" + m.op }

func (m moneyIntent) body() any {
	if m.op == "pay" {
		return client.PayRequest{PaymentMethod: "pm_ok"}
	}
	return client.CancelRequest{Reason: "fault suite"}
}

// resend sends the intent through the retrying client under its key.
func (m moneyIntent) resend(ctx context.Context, c *client.Client) (client.Status, error) {
	var res client.Result[client.Order]
	var err error
	if m.op == "pay" {
		res, err = c.Pay(ctx, m.orderID, client.PayRequest{PaymentMethod: "pm_ok"}, client.WithKey(m.key))
	} else {
		res, err = c.Cancel(ctx, m.orderID, client.CancelRequest{Reason: "fault suite"}, client.WithKey(m.key))
	}
	return res.Value.Status, err
}

func TestKilledInstanceMidPaymentNeverChargesTwice(t *testing.T) {
	runs := 20
	if testing.Short() {
		runs = 5
	}
	const latency = 300 * time.Millisecond
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FAULTS_SEED"); v != "" { // rerun one sequence of kill points
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("FAULTS_SEED=%q: %v", v, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	t.Logf("random kill points from FAULTS_SEED=%d", seed)

	c := startCluster(t, 2, time.Second)
	victim, survivor := c.instances[0], c.instances[1]
	c.channel.setLatency(t, latency)
	db := openDB(t, c.dbURL)
	seen := &answerTally{}
	api := newClient(survivor.url, 10*time.Second, seen)
	hc := rawHTTP(10 * time.Second)

	victimAnswers := tally{}
	var all []moneyIntent
	var outcomes []chan string // per intent: "" when it ended as wanted, else why not
	var slowest time.Duration
	refundNext := "" // an order paid in the previous run, cancelled (refunded) in this one
	for run := range runs {
		var intents []moneyIntent
		for j := range 2 {
			res, err := api.CreateOrder(context.Background(), createBody("kill", run*2+j))
			if err != nil {
				t.Fatalf("run %d: create order: %v", run, err)
			}
			intents = append(intents, moneyIntent{op: "pay", orderID: res.Value.ID, key: client.NewKey()})
		}
		if refundNext != "" {
			intents = append(intents, moneyIntent{op: "cancel", orderID: refundNext, key: client.NewKey()})
		}

		answers := make([]answer, len(intents))
		var sent sync.WaitGroup
		for i, in := range intents {
			sent.Go(func() { answers[i] = send(hc, http.MethodPost, victim.url+in.path(), apiKey, in.key, in.body()) })
		}
		delay := time.Duration(rng.Int64N(int64(latency + 100*time.Millisecond + 1)))
		time.Sleep(delay)
		victim.Kill(t)
		killed := time.Now()
		sent.Wait()
		for _, a := range answers {
			victimAnswers[a.label()]++
		}

		// Each intent's client resends it, same key, to the survivor, until
		// the service gives a definitive answer; checked after the last run.
		for _, in := range intents {
			done := make(chan string, 1)
			go func() {
				var status client.Status
				_, err := untilDefinitive(context.Background(), 30*time.Second, func(ctx context.Context) error {
					var err error
					status, err = in.resend(ctx, api)
					return err
				})
				want := map[string]client.Status{"pay": client.StatusPaid, "cancel": client.StatusCancelled}[in.op]
				if err != nil || status != want {
					done <- fmt.Sprintf("run %d (kill after %s): %s of %s ended %s %v, want %s",
						run, delay.Round(time.Millisecond), in.op, in.orderID, status, err, want)
				}
				close(done)
			}()
			outcomes = append(outcomes, done)
		}
		// The instance comes back while the survivor recovers its intents.
		restarted := make(chan error, 1)
		go func() { restarted <- victim.restart(t) }()
		settled := waitDefinitive(t, db, intents, lease+sweepInterval+2*latency+time.Second)
		slowest = max(slowest, settled.Sub(killed))
		if err := <-restarted; err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		all = append(all, intents...)
		refundNext = intents[0].orderID
	}
	for _, done := range outcomes {
		if why := <-done; why != "" {
			t.Error(why)
		}
	}
	pays, cancels := 0, 0
	for _, in := range all {
		if in.op == "pay" {
			pays++
		} else {
			cancels++
		}
	}
	t.Logf("%d runs: %d pays and %d refunds sent to the instance that died; its answers: %s; the survivor's: %s; slowest recovery %s after the kill",
		runs, pays, cancels, victimAnswers, seen.snapshot(), slowest.Round(time.Millisecond))

	t.Run("some kills land mid-payment: their intents are taken over", func(t *testing.T) {
		takenOver := count(t, db, `SELECT count(*) FROM idempotency_records WHERE lease_token > 1`)
		t.Logf("%d of %d intents finished by a new owner after the kill (the rest: done before it, or never reached the victim)", takenOver, len(all))
		if takenOver == 0 {
			t.Errorf("no kill landed while an intent was in flight: the scenario proved nothing")
		}
	})
	t.Run("the victim answers 200 or dies; the survivor answers 200, 201 or 409 request_in_progress", func(t *testing.T) {
		for label, n := range victimAnswers {
			if label != "200" && label != "transport error" {
				t.Errorf("the victim answered %q %d times", label, n)
			}
		}
		for label, n := range seen.snapshot() {
			switch label {
			case "200", "201", "409 request_in_progress":
			default:
				t.Errorf("the survivor answered %q %d times; want only 200, 201 and 409 request_in_progress", label, n)
			}
		}
	})
	t.Run("0 double charges: charges == paid orders, refunds == cancelled ones", func(t *testing.T) {
		stats := c.channel.stats(t)
		t.Logf("channel: %+v", stats)
		if stats.Charges != int64(pays) || stats.Refunds != int64(cancels) || stats.Declined != 0 {
			t.Errorf("channel made %d charges, %d refunds, %d declines; want %d, %d, 0", stats.Charges, stats.Refunds, stats.Declined, pays, cancels)
		}
		for ref, charges := range c.channel.chargesByOrder(t) {
			if len(charges) != 1 {
				t.Errorf("order %s has %d charges: %+v", ref, len(charges), charges)
			}
		}
		paid := count(t, db, `SELECT count(*) FROM orders WHERE status = 'PAID'`)
		cancelled := count(t, db, `SELECT count(*) FROM orders WHERE status = 'CANCELLED'`)
		if paid+cancelled != pays || cancelled != cancels {
			t.Errorf("orders PAID %d and CANCELLED %d, want %d and %d", paid, cancelled, pays-cancels, cancels)
		}
	})
	t.Run("channel charges minus refunds equal what the orders hold", func(t *testing.T) {
		stats := c.channel.stats(t)
		held := count(t, db, `SELECT COALESCE(sum(total_amount), 0)::int FROM orders WHERE status = 'PAID'`)
		if stats.AmountCharged-stats.AmountRefunded != int64(held) {
			t.Errorf("channel holds %d - %d = %d, the PAID orders total %d",
				stats.AmountCharged, stats.AmountRefunded, stats.AmountCharged-stats.AmountRefunded, held)
		}
	})
	t.Run("every intent completed", func(t *testing.T) {
		if n := unfinishedRecords(t, db); n != 0 {
			t.Errorf("unfinished records = %d", n)
		}
		if got := recordStates(t, db, "order.pay"); got["SUCCEEDED"] != pays || len(got) != 1 {
			t.Errorf("order.pay records = %v, want {SUCCEEDED: %d}", got, pays)
		}
		if got := recordStates(t, db, "order.cancel"); got["SUCCEEDED"] != cancels || len(got) > 1 {
			t.Errorf("order.cancel records = %v, want {SUCCEEDED: %d}", got, cancels)
		}
	})
}

// waitDefinitive waits until every intent's record is SUCCEEDED or
// FAILED_FINAL, and fails the test if that takes longer than within.
func waitDefinitive(t *testing.T, db *pgxpool.Pool, intents []moneyIntent, within time.Duration) time.Time {
	t.Helper()
	keys := make([]string, len(intents))
	for i, in := range intents {
		keys[i] = in.key
	}
	deadline := time.Now().Add(within)
	for {
		done := count(t, db, `SELECT count(*) FROM idempotency_records
			WHERE tenant_id = $1 AND idempotency_key = ANY($2) AND state IN ('SUCCEEDED', 'FAILED_FINAL')`, tenant, keys)
		if done == len(keys) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d intents still unfinished %s after the kill (lease %s, sweep %s)", len(keys)-done, len(keys), within, lease, sweepInterval)
			return time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}
