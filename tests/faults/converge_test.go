//go:build faults

package faults

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
)

// convergeMethods are the test tokens the convergence run pays with: each
// brings its own kind of trouble on top of the injected faults.
var convergeMethods = []string{"pm_ok", "pm_declined", "pm_lost_response", "pm_unavailable_once", "pm_refund_refused", "pm_slow",
	"pm_async_ok", "pm_async_declined"}

// The property issue 11 states: once faults stop, every intent reaches
// SUCCEEDED or FAILED_FINAL within a lease and a sweep interval, and every
// order leaves its pending states, whatever mix of refusals, lost
// responses, 503s, channel restarts and instance kills came before, and
// with no client retrying for it. Payments that finish later are in the
// mix, their webhooks duplicated, reordered and dropped: each order still
// leaves PAYMENT_PENDING, by a webhook or the sweeper's lookup, and is
// charged once.
func TestEveryIntentConvergesAfterMixedFaults(t *testing.T) {
	orders, kills, channelRestarts, workers := 240, 3, 2, 8
	if testing.Short() {
		orders, kills, channelRestarts, workers = 60, 1, 1, 6
	}
	c := startCluster(t, 2, 200*time.Millisecond, "PAYMENT_PENDING_CHECK_EVERY="+pendingCheck.String())
	db := openDB(t, c.dbURL)
	c.channel.setFaults(t, convergeFaults)
	hc := rawHTTP(4 * time.Second)
	seen := &answerTally{}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random choices from seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var rngMu sync.Mutex
	pick := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	// The chaos: instance kills and channel restarts, spread evenly over the
	// run (the n-th event once n/(events+1) of the orders went out).
	var live [2]atomic.Bool
	live[0].Store(true)
	live[1].Store(true)
	var dispatched atomic.Int64
	done := make(chan struct{})
	chaos := make(chan error, 1)
	var injected struct{ kills, channelRestarts int }
	events := kills + channelRestarts
	go func() {
		defer close(chaos)
		for e := range events {
			for dispatched.Load() < int64(orders*(e+1)/(events+1)) {
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			if e%2 == 0 && injected.kills < kills || injected.channelRestarts == channelRestarts {
				i := injected.kills % 2
				live[i].Store(false)
				c.instances[i].Kill(t)
				injected.kills++
				time.Sleep(300 * time.Millisecond)
				if err := c.instances[i].restart(t); err != nil {
					chaos <- err
					return
				}
				live[i].Store(true)
				continue
			}
			if err := c.channel.restart(t); err != nil {
				chaos <- err
				return
			}
			c.channel.setFaults(t, convergeFaults) // a restarted channel forgets its faults
			injected.channelRestarts++
		}
	}()

	// Each order is a create, a pay with a random token, then a cancel or a
	// ship. Creates are sent until definitive (they are one transaction, so
	// the orders count is exact); the money intents get one or two attempts
	// and are then abandoned, to the sweeper.
	target := func() string {
		i := pick(2)
		if !live[i].Load() {
			i = 1 - i
		}
		return c.instances[i].url
	}
	var (
		mu      sync.Mutex
		created = map[string]string{} // create key -> order id
		intents = map[string]int{}    // op -> intents sent
		reached = map[string]int{}    // op -> intents of which an attempt got an HTTP answer
	)
	sendMoney := func(op, path, key string, body any) answer {
		var a answer
		answered := false
		for range 1 + pick(2) {
			a = send(hc, http.MethodPost, target()+path, apiKey, key, body)
			seen.add(a.label())
			answered = answered || a.err == nil
			if a.err == nil && a.status != http.StatusServiceUnavailable && a.code() != client.CodeInProgress {
				break
			}
		}
		mu.Lock()
		intents[op]++
		if answered {
			reached[op]++
		}
		mu.Unlock()
		return a
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for n := range work {
				key := fmt.Sprintf("converge-create-%d", n)
				var a answer
				for try := 0; try < 100; try++ {
					a = send(hc, http.MethodPost, target()+"/v1/orders", apiKey, key, createBody("converge", n))
					seen.add(a.label())
					if a.err == nil && a.status == http.StatusCreated {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if a.status != http.StatusCreated {
					t.Errorf("create %d never succeeded: %s", n, a)
					continue
				}
				var o orderView
				if err := json.Unmarshal(a.body, &o); err != nil || o.ID == "" {
					t.Errorf("create %d: not an order: %s", n, a)
					continue
				}
				id := o.ID
				mu.Lock()
				created[key] = id
				intents["create"]++
				reached["create"]++
				mu.Unlock()

				method := convergeMethods[(n/3)%len(convergeMethods)] // independent of n%3, which picks cancel or ship
				pay := sendMoney("pay", "/v1/orders/"+id+"/pay", fmt.Sprintf("converge-pay-%d", n), client.PayRequest{PaymentMethod: method})
				if pay.status != http.StatusOK {
					continue // declined, or left to the sweeper
				}
				op, body := "cancel", any(client.CancelRequest{Reason: "converge"})
				if n%3 == 1 {
					op, body = "ship", client.ShipRequest{Carrier: "DHL", TrackingNumber: fmt.Sprintf("T%d", n)}
				}
				sendMoney(op, "/v1/orders/"+id+"/"+op, fmt.Sprintf("converge-%s-%d", op, n), body)
			}
		})
	}
	for n := range orders {
		work <- n
		dispatched.Add(1)
	}
	close(work)
	wg.Wait()
	close(done)
	if err := <-chaos; err != nil {
		t.Fatalf("chaos: %v", err)
	}

	// The faults stop: every process up, the channel healthy.
	for i, s := range c.instances {
		if s.Exited() {
			t.Fatalf("instance %d is down after the chaos", i+1)
		}
	}
	c.channel.setFaults(t, nil)
	stopped := time.Now()
	unfinished, pending := -1, -1
	bound := max(lease, asyncDelay+pendingCheck) + sweepInterval
	// A moment beyond the bound for the last sweep to make its channel calls
	// and commits on a loaded two-core machine; the time taken is reported.
	for time.Since(stopped) < bound+3*time.Second {
		unfinished = unfinishedRecords(t, db)
		pending = count(t, db, `SELECT count(*) FROM orders WHERE status IN ('PAYMENT_PENDING', 'REFUND_PENDING')`)
		if unfinished == 0 && pending == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	converged := time.Since(stopped)
	t.Logf("intents %v (answered %v) over %d orders; injected %d instance kills, %d channel restarts, channel faults %v; answers: %s",
		intents, reached, orders, injected.kills, injected.channelRestarts, convergeFaults, seen.snapshot())
	t.Logf("converged %s after the faults stopped (lease %s + sweep interval %s = %s)", converged.Round(time.Millisecond), lease, sweepInterval, bound)
	if unfinished != 0 || pending != 0 {
		t.Fatalf("%s after the faults stopped: %d intents unfinished, %d orders pending", converged.Round(time.Millisecond), unfinished, pending)
	}

	// Exact counts.
	if n := count(t, db, `SELECT count(*) FROM orders`); n != intents["create"] || n != orders {
		t.Errorf("orders = %d, create intents = %d, orders sent = %d", n, intents["create"], orders)
	}
	// Every intent that reached the service has its record, and every record
	// is definitive; an intent none of whose attempts got an answer may never
	// have arrived (it went to an instance as it died).
	for _, op := range []string{"create", "pay", "cancel", "ship"} {
		states := recordStates(t, db, "order."+op)
		got := states["SUCCEEDED"] + states["FAILED_FINAL"]
		if len(states) > 2 || got < reached[op] || got > intents[op] {
			t.Errorf("order.%s records %v, want all SUCCEEDED or FAILED_FINAL, between %d (answered) and %d (sent)",
				op, states, reached[op], intents[op])
		}
	}
	st := c.channel.stats(t)
	held := count(t, db, `SELECT COALESCE(sum(total_amount), 0) FROM orders WHERE status IN ('PAID', 'SHIPPED', 'DELIVERED')`)
	if got := int(st.AmountCharged - st.AmountRefunded); got != held {
		t.Errorf("the channel holds %d (charged %d - refunded %d), the PAID/SHIPPED/DELIVERED orders %d",
			got, st.AmountCharged, st.AmountRefunded, held)
	}
	for ref, charges := range c.channel.chargesByOrder(t) {
		succeeded := 0
		for _, ch := range charges {
			if ch.Status == "succeeded" {
				succeeded++
			}
		}
		if succeeded > 1 {
			t.Errorf("order %s was charged %d times", ref, succeeded)
		}
	}
	if n := seen.snapshot()["500 internal"]; n > 0 {
		t.Errorf("%d answers were 500", n)
	}
	t.Logf("channel: %d charges, %d declined, %d refunds, %d duplicates absorbed, %d lost responses; holds %d = orders' %d",
		st.Charges, st.Declined, st.Refunds, st.DuplicatesAbsorbed, st.LostResponses, st.AmountCharged-st.AmountRefunded, held)
}

// convergeFaults are the channel's own faults during the run.
var convergeFaults = map[string]any{"lost_response_rate": 0.15, "unavailable_rate": 0.15, "latency_ms": 20, "latency_jitter_ms": 60,
	"webhook_duplicate_rate": 0.3, "webhook_drop_rate": 0.3, "webhook_reorder_ms": 200}

// pendingCheck is how often the convergence run's sweepers ask the channel
// about a payment that finishes later whose webhook has not come.
const pendingCheck = 500 * time.Millisecond
