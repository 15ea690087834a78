package order_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/testdb"
	"github.com/orderservice/orderservice/internal/testproc"
)

// crashOnce returns a hook that crashes (by error or by panic) the first
// time it runs and does nothing afterwards, as a process that died once and
// was replaced would behave.
func crashOnce(panics bool) (hook func() error, calls *atomic.Int32) {
	calls = new(atomic.Int32)
	return func() error {
		if calls.Add(1) != 1 {
			return nil
		}
		if panics {
			panic("injected crash")
		}
		return errors.New("injected crash")
	}, calls
}

// expireLease makes the owner of the acme intent (op, key) look dead.
func expireLease(t *testing.T, tenant, op, key string) {
	t.Helper()
	db := moneyDB(t)
	res := db.Exec(`UPDATE idempotency_records SET lease_expires_at = now() - interval '1s'
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`, tenant, op, key)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("expire lease of %s %s: %v (%d rows)", op, key, res.Error, res.RowsAffected)
	}
}

func TestCrashAtAPhaseBoundaryIsRecovered(t *testing.T) {
	boundaries := []struct {
		name    string
		set     func(h *order.Hooks, f func() error)
		charged bool // the channel charged before the crash
	}{
		{"after phase 1", func(h *order.Hooks, f func() error) { h.AfterPhase1 = f }, false},
		{"after the channel call", func(h *order.Hooks, f func() error) { h.AfterChannelCall = f }, true},
		{"before phase 3 commits", func(h *order.Hooks, f func() error) { h.BeforeReplyCommit = f }, true},
	}
	for _, recoverer := range []struct {
		name string
		env  map[string]string
	}{
		{"the sweeper", nil},
		{"a client retry after the lease", map[string]string{"SWEEP_INTERVAL": "1h"}},
	} {
		for _, b := range boundaries {
			for _, panics := range []bool{false, true} {
				crash := "an error"
				if panics {
					crash = "a panic"
				}
				name := fmt.Sprintf("%s %s is finished by %s with one charge", crash, b.name, recoverer.name)
				t.Run(name, func(t *testing.T) {
					m, c := startMoney(t, recoverer.env)
					id := createOrder(t, c, moneyKey("create"))
					key := moneyKey("R2-crash")
					hook, _ := crashOnce(panics)
					b.set(&m.Orders.Hooks, hook)

					first, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok"), nil)
					if err != nil {
						t.Fatalf("the crashed request got no HTTP answer (%v): a panic must become a 500, not a dropped connection", err)
					}
					apptest.WantAnswer(t, "crashed pay", first, http.StatusInternalServerError, "internal")
					if ready := c.Do(t, http.MethodGet, "/healthz", "", nil); ready.Status != http.StatusOK {
						t.Fatalf("the service is not alive after the crash: %d", ready.Status)
					}
					if got := moneyReadOrder(t, c, id).Status; got != "PAYMENT_PENDING" {
						t.Errorf("order right after the crash = %s, want PAYMENT_PENDING", got)
					}
					if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.Processing || rec.LeaseToken != 1 {
						t.Errorf("record right after the crash = %s token %d, want PROCESSING token 1", rec.State, rec.LeaseToken)
					}
					charged := int64(0)
					if b.charged {
						charged = 1
					}
					moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: charged, declined: 0, refunds: 0, requests: charged, lookups: 0, duplicates: 0})

					var finisher apptest.Response
					if recoverer.env == nil {
						moneyEventually(t, 10*time.Second, "PAID by the sweeper", func() (bool, string) {
							rec := moneyRecord(t, m, order.OpPay, key)
							o := moneyReadOrder(t, c, id)
							return rec.State == idempotency.Succeeded && o.Status == "PAID", fmt.Sprintf("record %s, order %s", rec.State, o.Status)
						})
					} else {
						early := moneyPay(t, c, id, key, "pm_ok")
						apptest.WantAnswer(t, "a retry while the dead owner's lease runs", early, http.StatusConflict, "request_in_progress")
						if s, _ := strconv.Atoi(early.Header.Get("Retry-After")); s < 1 || s > 3 {
							t.Errorf("Retry-After = %q, want 1..3 (seconds left on a 3s lease)", early.Header.Get("Retry-After"))
						}
						moneyEventually(t, 10*time.Second, "taken over by a client retry", func() (bool, string) {
							finisher = moneyPay(t, c, id, key, "pm_ok")
							return !moneyTransient(finisher), fmt.Sprintf("%d %s", finisher.Status, finisher.Body)
						})
						if finisher.Status != http.StatusOK || moneyDecodeOrder(t, finisher.Body).Status != "PAID" {
							t.Fatalf("retry after the lease = %d %s", finisher.Status, finisher.Body)
						}
						apptest.WantExecuted(t, finisher)
					}

					// The successor asked the channel under the same key first; it
					// charged only if nothing had been charged before the crash.
					moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
					if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded"; got != want {
						t.Errorf("history = %s, want %s", got, want)
					}
					rec := moneyRecord(t, m, order.OpPay, key)
					if rec.State != idempotency.Succeeded || rec.LeaseToken != 2 || rec.Attempts != 2 {
						t.Errorf("record = %s token %d attempts %d, want SUCCEEDED token 2 attempts 2", rec.State, rec.LeaseToken, rec.Attempts)
					}

					replay := moneyPay(t, c, id, key, "pm_ok")
					if replay.Status != http.StatusOK || replay.Header.Get("Idempotent-Replayed") != "true" {
						t.Fatalf("client retry after recovery = %d %v %s, want the stored 200", replay.Status, replay.Header, replay.Body)
					}
					if o := moneyDecodeOrder(t, replay.Body); o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" {
						t.Errorf("stored answer = %s", replay.Body)
					}
					if finisher.Status != 0 && !bytes.Equal(replay.Body, finisher.Body) {
						t.Errorf("replay %s differs from the retry's answer %s", replay.Body, finisher.Body)
					}
					apptest.WantReplay(t, replay, moneyPay(t, c, id, key, "pm_ok"))
					if got := m.Channel.Stats().Requests; got != 1 {
						t.Errorf("channel POSTs after the replays = %d, want 1", got)
					}
				})
			}
		}
	}
}

func TestSupersededOwnerCannotWrite(t *testing.T) {
	t.Run("a completion with the superseded token affects 0 rows and is ErrFenced", func(t *testing.T) {
		m, _ := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		store := m.Orders.Records
		fp, err := idempotency.Fingerprint(order.OpPay, "fence-order", map[string]string{"payment_method": "pm_ok"})
		if err != nil {
			t.Fatal(err)
		}
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "fence-test", Operation: order.OpPay, Key: moneyKey("fence")},
			Fingerprint: fp}
		t.Cleanup(func() {
			moneyDB(t).Exec("DELETE FROM idempotency_records WHERE tenant_id = ? AND idempotency_key = ?", in.TenantID, in.Key)
		})
		row := func() string { return apptest.RecordRow(t, moneyDB(t), in.Scope) }
		late := func(resource string) idempotency.Result { return idempotency.Done(resource, []byte(`{"late":true}`)) }
		lateFailure := idempotency.Failed("", problem.Errorf(order.CodeNotFound, "late"))

		old, err := store.ClaimOrReplay(m.DB, in)
		if err != nil || old.Token() != 1 || old.Replay != nil || old.Resumes() {
			t.Fatalf("first claim = %+v, %v", old, err)
		}
		if _, err := store.ClaimOrReplay(m.DB, in); problem.CodeOf(err) != problem.RequestInProgress {
			t.Fatalf("claim while the lease runs = %v, want request_in_progress", err)
		}
		expireLease(t, in.TenantID, in.Operation, in.Key)
		next, err := store.ClaimOrReplay(m.DB, in)
		if err != nil || next.Token() != 2 || !next.Resumes() || next.ResumedFrom != idempotency.Processing {
			t.Fatalf("takeover = %+v, %v; want token 2 resumed from PROCESSING", next, err)
		}

		before := row()
		if err := store.Complete(m.DB, in.Scope, old.Token(), late("late-resource")); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("Complete with the old token = %v, want ErrFenced", err)
		}
		if err := store.Fail(m.DB, in.Scope, old.Token(), time.Second); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("Fail with the old token = %v, want ErrFenced", err)
		}
		if after := row(); after != before {
			t.Errorf("the superseded owner changed the record:\nbefore %s\nafter  %s", before, after)
		}

		// Inside a transaction the fence undoes the business write as well.
		err = m.DB.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("UPDATE idempotency_records SET attempts = attempts + 100 WHERE tenant_id = ? AND idempotency_key = ?",
				in.TenantID, in.Key).Error; err != nil {
				return err
			}
			return store.Complete(tx, in.Scope, old.Token(), late(""))
		})
		if !errors.Is(err, idempotency.ErrFenced) || row() != before {
			t.Errorf("fenced transaction = %v; record %s, want it rolled back to %s", err, row(), before)
		}

		if err := store.Complete(m.DB, in.Scope, next.Token(), late("r-1")); err != nil {
			t.Fatalf("Complete by the current owner: %v", err)
		}
		done := row()
		if err := store.Complete(m.DB, in.Scope, old.Token(), lateFailure); !errors.Is(err, idempotency.ErrFenced) || row() != done {
			t.Errorf("late Complete after the successor finished = %v, record changed: %v", err, row() != done)
		}
		if rec, _ := store.Get(m.DB, in.Scope); rec.State != idempotency.Succeeded || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want SUCCEEDED token 2", rec.State, rec.LeaseToken)
		}
	})

	// blockFirstSettle makes the first owner stop right after the channel
	// answered, until release is closed; later owners pass through.
	blockFirstSettle := func(t *testing.T, h *order.Hooks) (reached, release chan struct{}) {
		reached, release = make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		h.AfterChannelCall = func() error {
			if calls.Add(1) == 1 {
				close(reached)
				select {
				case <-release:
				case <-time.After(30 * time.Second):
				}
			}
			return nil
		}
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		return reached, release
	}

	// payInBackground sends the pay of the first owner.
	payInBackground := func(c *apptest.Client, id, key string) chan apptest.Response {
		out := make(chan apptest.Response, 1)
		go func() {
			r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok"), nil)
			if err != nil {
				r = apptest.Response{Status: -1, Body: []byte(err.Error())}
			}
			out <- r
		}()
		return out
	}

	waitFor := func(t *testing.T, ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}

	t.Run("the first owner's late settle is fenced after a retry took over and finished", func(t *testing.T) {
		m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-fenced")
		reached, release := blockFirstSettle(t, &m.Orders.Hooks)

		firstOwner := payInBackground(c, id, key)
		waitFor(t, reached, "the first owner to reach the channel")
		expireLease(t, moneyTenant, order.OpPay, key)
		successor := moneyPay(t, c, id, key, "pm_ok")
		if successor.Status != http.StatusOK || moneyDecodeOrder(t, successor.Body).Status != "PAID" {
			t.Fatalf("the retry that took over = %d %s", successor.Status, successor.Body)
		}
		close(release)
		late := <-firstOwner

		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
		if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s (exactly one payment_succeeded)", got, want)
		}
		rec := moneyRecord(t, m, order.OpPay, key)
		if rec.State != idempotency.Succeeded || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want SUCCEEDED token 2 (the successor's)", rec.State, rec.LeaseToken)
		}
		apptest.WantReplay(t, successor, moneyPay(t, c, id, key, "pm_ok"))
		// Checked last: the superseded owner must be told to retry for the
		// successor's result, not given a business failure for a payment
		// that succeeded.
		apptest.WantAnswer(t, "the superseded owner's answer", late, http.StatusConflict, "request_in_progress")
	})

	t.Run("the first owner's settle is refused while a successor holds the intent", func(t *testing.T) {
		m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-held")
		reached, release := blockFirstSettle(t, &m.Orders.Hooks)

		firstOwner := payInBackground(c, id, key)
		waitFor(t, reached, "the first owner to reach the channel")
		expireLease(t, moneyTenant, order.OpPay, key)
		// A successor takes the intent over and has not settled yet.
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: moneyTenant, Operation: order.OpPay, Key: key}}
		in.Fingerprint = moneyRecord(t, m, order.OpPay, key).Fingerprint
		held, err := m.Orders.Records.ClaimOrReplay(m.DB, in)
		if err != nil || held.Token() != 2 {
			t.Fatalf("successor's takeover = %+v, %v", held, err)
		}
		close(release)
		late := <-firstOwner
		apptest.WantAnswer(t, "the superseded owner's answer", late, http.StatusConflict, "request_in_progress")
		if late.Header.Get("Retry-After") == "" {
			t.Error("request_in_progress without Retry-After")
		}
		if got := moneyReadOrder(t, c, id).Status; got != "PAYMENT_PENDING" {
			t.Errorf("order after the fenced settle = %s, want PAYMENT_PENDING (its write rolled back)", got)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND status = 'pending'", id); n != 1 {
			t.Errorf("pending payments after the fenced settle = %d, want 1", n)
		}
		if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.Processing || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want PROCESSING token 2", rec.State, rec.LeaseToken)
		}

		// The successor dies too; a client retry after its lease finishes
		// the intent from the channel's record, without a second charge.
		expireLease(t, moneyTenant, order.OpPay, key)
		done := moneyPay(t, c, id, key, "pm_ok")
		if done.Status != http.StatusOK || moneyDecodeOrder(t, done.Body).Status != "PAID" {
			t.Fatalf("retry after the successor's lease = %d %s", done.Status, done.Body)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
		if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
}

func TestKilledServiceRecoversPaymentAfterRestart(t *testing.T) {
	moneyIsolate(t)
	bins, err := testproc.Build(t.TempDir(), orderservicePkg, paymentchannelPkg)
	if err != nil {
		t.Fatal(err)
	}
	channelAddr, apiAddr := testproc.FreeAddr(t), testproc.FreeAddr(t)
	startBinary(t, "paymentchannel", bins[paymentchannelPkg], "http://"+channelAddr+"/healthz", "HTTP_ADDR="+channelAddr, "LOG_LEVEL=warn",
		"CHANNEL_DATABASE_URL="+testdb.Fresh(t, "order_channel"))
	serviceEnv := []string{
		"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + apiAddr, "PAYMENT_CHANNEL_URL=http://" + channelAddr,
		"IDEMPOTENCY_LEASE=3s", "PAYMENT_CHANNEL_TIMEOUT=2s", "SWEEP_INTERVAL=200ms",
		"API_KEYS=acme=" + apptest.KeyAcme, "LOG_LEVEL=warn",
		"NATS_EMBEDDED_ADDR=127.0.0.1:0", "NATS_STORE_DIR=" + t.TempDir(),
	}
	service := startBinary(t, "orderservice-1", bins[orderservicePkg], "http://"+apiAddr+"/readyz", serviceEnv...)

	c := &apptest.Client{BaseURL: "http://" + apiAddr, APIKey: apptest.KeyAcme, HTTP: &http.Client{Timeout: 30 * time.Second}}
	admin := &apptest.Client{BaseURL: "http://" + channelAddr, HTTP: &http.Client{Timeout: 10 * time.Second}}
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-killed")
	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"latency_ms": 1500}); r.Status != http.StatusOK {
		t.Fatalf("set channel faults: %d %s", r.Status, r.Body)
	}

	answered := make(chan string, 1)
	go func() {
		r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok"), nil)
		if err != nil {
			answered <- ""
			return
		}
		answered <- fmt.Sprintf("%d %s", r.Status, r.Body)
	}()
	time.Sleep(300 * time.Millisecond)
	service.Kill(t)
	if got := <-answered; got != "" {
		t.Fatalf("the pay was answered (%s) before the service was killed mid-payment", got)
	}
	if got := apptest.ChannelStats(t, admin).Charges; got > 1 {
		t.Fatalf("charges right after the kill = %d", got)
	}

	startBinary(t, "orderservice-2", bins[orderservicePkg], "http://"+apiAddr+"/readyz", serviceEnv...)
	moneyEventually(t, 20*time.Second, "PAID after the restart", func() (bool, string) {
		o := moneyReadOrder(t, c, id)
		return o.Status == "PAID", o.Status
	})
	if got := apptest.ChannelStats(t, admin).Charges; got != 1 {
		t.Errorf("channel charges = %d, want exactly 1", got)
	}
	retry := moneyPay(t, c, id, key, "pm_ok")
	if retry.Status != http.StatusOK || moneyDecodeOrder(t, retry.Body).Status != "PAID" {
		t.Fatalf("client retry after the restart = %d %s", retry.Status, retry.Body)
	}
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("client retry was not a replay of the recovered outcome: %v", retry.Header)
	}
	stats := apptest.ChannelStats(t, admin)
	t.Logf("channel after recovery and retry: %+v", stats)
	if stats.Charges != 1 || stats.AmountCharged != moneyTotal {
		t.Errorf("channel after the retry: %+v, want 1 charge of %d", stats, moneyTotal)
	}
	if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
}

const (
	orderservicePkg   = "github.com/orderservice/orderservice/cmd/orderservice"
	paymentchannelPkg = "github.com/orderservice/orderservice/cmd/paymentchannel"
)

// startBinary runs a binary and waits until readyURL answers 200.
func startBinary(t *testing.T, name, bin, readyURL string, env ...string) *testproc.Process {
	t.Helper()
	p, err := testproc.Start(t, name, bin, env)
	if err == nil {
		err = testproc.WaitOK(readyURL, 20*time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTheSweeperWaitsForAPlaceAtTheChannel: the sweeper takes over an
// intent whose owner died after phase 1, but PAYMENT_CHANNEL_MAX_IN_FLIGHT
// bounds the sweeper's calls too. While another pay holds the only place,
// the sweeper claims nothing (a claim it could not start would let the
// lease run out while it waited), so the intent does not reach the channel,
// not even to ask it for the outcome; once the place is free it is taken
// over and finished, with one charge.
func TestTheSweeperWaitsForAPlaceAtTheChannel(t *testing.T) {
	m, c := startMoney(t, map[string]string{"PAYMENT_CHANNEL_MAX_IN_FLIGHT": "1"})
	crash, _ := crashOnce(false)
	holding, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	m.Orders.Hooks.AfterPhase1 = crash
	m.Orders.Hooks.AfterChannelCall = func() error { // the second pay's call holds its place here
		if calls.Add(1) == 1 {
			close(holding)
			<-release
		}
		return nil
	}

	orphan, orphanKey := createOrder(t, c, moneyKey("create-orphan")), moneyKey("pay-orphan")
	apptest.WantAnswer(t, "the pay whose owner dies after phase 1",
		moneyPay(t, c, orphan, orphanKey, "pm_ok"), http.StatusInternalServerError, "internal")

	holder, holderKey := createOrder(t, c, moneyKey("create-holder")), moneyKey("pay-holder")
	held := make(chan apptest.Response, 1)
	go func() { held <- moneyPay(t, c, holder, holderKey, "pm_ok") }()
	<-holding
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, requests: 1})

	expireLease(t, moneyTenant, order.OpPay, orphanKey)
	// A sweep now (the service's own sweeper runs too) claims nothing: the
	// only place is held. One that ignored the bound would take the orphan.
	if n, err := m.Orders.Sweep(context.Background(), 100); err != nil || n != 0 {
		t.Fatalf("a sweep while the place is held took %d intents (%v), want 0", n, err)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, requests: 1})
	if rec := moneyRecord(t, m, order.OpPay, orphanKey); rec.State != idempotency.Processing || rec.LeaseToken != 1 {
		t.Errorf("the orphan while the place is held = %s token %d, want PROCESSING token 1", rec.State, rec.LeaseToken)
	}

	close(release)
	if r := <-held; r.Status != http.StatusOK || moneyDecodeOrder(t, r.Body).Status != "PAID" {
		t.Fatalf("the pay that held the place = %d %s, want 200 PAID", r.Status, r.Body)
	}
	moneyEventually(t, 10*time.Second, "the orphan PAID by the sweeper", func() (bool, string) {
		rec := moneyRecord(t, m, order.OpPay, orphanKey)
		o := moneyReadOrder(t, c, orphan)
		return rec.State == idempotency.Succeeded && o.Status == "PAID", fmt.Sprintf("record %s, order %s", rec.State, o.Status)
	})
	// The sweeper asked the channel for the orphan's outcome (none), then charged it.
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 2, requests: 2, lookups: 1})
}
