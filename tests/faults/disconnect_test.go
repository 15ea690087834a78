//go:build faults

package faults

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
)

func TestClientHangingUpMidChargeStillGetsTheReplay(t *testing.T) {
	const slowDelay = 500 * time.Millisecond
	c := startCluster(t, 1, slowDelay)
	svc := c.instances[0]
	db := openDB(t, c.dbURL)
	created, err := newClient(svc.url, 10*time.Second, nil).CreateOrder(context.Background(), createBody("hangup", 1))
	if err != nil {
		t.Fatalf("create order: %v", err)
	}
	id := created.Value.ID
	key := client.NewKey()
	pay := client.PayRequest{PaymentMethod: "pm_slow"}

	// The client waits 100ms for a charge that takes 500ms, and hangs up.
	impatient := send(rawHTTP(100*time.Millisecond), http.MethodPost, svc.url+"/v1/orders/"+id+"/pay", apiKey, key, pay)
	if impatient.err == nil {
		t.Fatalf("the 100ms client got an answer (%s) from a 500ms charge", impatient)
	}
	hungUp := time.Now()

	t.Run("the outcome is recorded without any retry", func(t *testing.T) {
		var state string
		var token, attempts int
		deadline := hungUp.Add(slowDelay + 3*time.Second)
		for {
			err := db.QueryRow(context.Background(), `SELECT state, lease_token, attempts FROM idempotency_records
				WHERE tenant_id = $1 AND operation = 'order.pay' AND idempotency_key = $2`, tenant, key).Scan(&state, &token, &attempts)
			if err == nil && state == "SUCCEEDED" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("record %s 3s after the charge (err %v), want SUCCEEDED", state, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("SUCCEEDED %s after the hang-up", time.Since(hungUp).Round(time.Millisecond))
		if token != 1 || attempts != 1 {
			t.Errorf("record lease_token %d attempts %d, want 1 and 1: the first owner finished it, no takeover", token, attempts)
		}
		if n := count(t, db, `SELECT count(*) FROM orders WHERE id = $1 AND status = 'PAID'`, id); n != 1 {
			t.Errorf("order is not PAID")
		}
		charges := c.channel.chargesByOrder(t)[id]
		if len(charges) != 1 || charges[0].Status != "succeeded" || charges[0].Requests != 1 {
			t.Errorf("channel charges for the order = %+v, want 1 succeeded charge from 1 request", charges)
		}
	})

	t.Run("the retry gets the replay, not 409", func(t *testing.T) {
		retry := send(rawHTTP(10*time.Second), http.MethodPost, svc.url+"/v1/orders/"+id+"/pay", apiKey, key, pay)
		if retry.status != http.StatusOK || !retry.replayed() {
			t.Fatalf("retry = %s (Idempotent-Replayed %q), want 200 replayed", retry, retry.header.Get("Idempotent-Replayed"))
		}
		if o := decodeOrder(t, retry); o.Status != "PAID" || o.ID != id {
			t.Errorf("replayed order = %+v, want %s PAID", o, id)
		}
		if s := c.channel.stats(t); s.Charges != 1 || s.Requests != 1 {
			t.Errorf("channel after the replay: %+v, want 1 charge from 1 request", s)
		}
	})
}
