//go:build faults

package faults

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
)

// storm sends n requests at once, request i to instance i mod len(urls),
// each built by req, and returns every answer.
func storm(n int, urls []string, req func(i int, baseURL string) answer) []answer {
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = req(i, urls[i%len(urls)])
		})
	}
	close(start)
	wg.Wait()
	return answers
}

func (c *cluster) urls() []string {
	out := make([]string, len(c.instances))
	for i, s := range c.instances {
		out[i] = s.url
	}
	return out
}

func TestIdenticalCreatesAcrossThreeInstancesMakeOneOrder(t *testing.T) {
	copies := 500
	if testing.Short() {
		copies = 200
	}
	c := startCluster(t, 3, time.Second)
	db := openDB(t, c.dbURL)
	hc := rawHTTP(60 * time.Second)
	key := client.NewKey()
	body := createBody("storm", 1)

	began := time.Now()
	answers := storm(copies, c.urls(), func(_ int, url string) answer {
		return send(hc, http.MethodPost, url+"/v1/orders", apiKey, key, body)
	})
	took := time.Since(began)

	counts, first, fresh := sameIntentAnswers(t, answers, http.StatusCreated)
	t.Logf("%d identical creates over 3 instances in %s: %s", copies, took.Round(time.Millisecond), counts)

	t.Run("only identical 201s and 409 request_in_progress answer", func(t *testing.T) {
		if got := counts["201"] + counts["409 request_in_progress"]; got != copies {
			t.Errorf("answers = %s; want only 201 and 409 request_in_progress (%d in all)", counts, copies)
		}
		if first == nil {
			t.Fatal("no 201 at all")
		}
		if fresh != 1 {
			t.Errorf("201s without Idempotent-Replayed = %d, want exactly 1 (the first real result; the rest replay it)", fresh)
		}
	})
	t.Run("exactly one order and one SUCCEEDED record exist", func(t *testing.T) {
		if n := count(t, db, `SELECT count(*) FROM orders`); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
		if got := recordStates(t, db, "order.create"); len(got) != 1 || got["SUCCEEDED"] != 1 {
			t.Errorf("order.create records by state = %v, want {SUCCEEDED: 1}", got)
		}
		if first != nil {
			id := decodeOrder(t, *first).ID
			if n := count(t, db, `SELECT count(*) FROM orders WHERE id = $1`, id); n != 1 {
				t.Errorf("the order the 201s name (%s) is not the one stored", id)
			}
		}
	})
}

func TestPaysAcrossThreeInstancesChargeEachOrderOnce(t *testing.T) {
	sameKeyClients, distinctKeys := 100, 50
	if testing.Short() {
		sameKeyClients, distinctKeys = 40, 20
	}
	c := startCluster(t, 3, time.Second)
	db := openDB(t, c.dbURL)
	// A little channel latency keeps the first pay in flight while its
	// duplicates arrive.
	c.channel.setLatency(t, 200*time.Millisecond)
	hc := rawHTTP(60 * time.Second)
	api := newClient(c.instances[0].url, 10*time.Second, nil)

	create := func(n int) string {
		res, err := api.CreateOrder(context.Background(), createBody("pay", n))
		if err != nil {
			t.Fatalf("create order: %v", err)
		}
		return res.Value.ID
	}

	t.Run(fmt.Sprintf("%d clients paying with one key make one charge", sameKeyClients), func(t *testing.T) {
		id := create(1)
		key := client.NewKey()
		answers := storm(sameKeyClients, c.urls(), func(_ int, url string) answer {
			return send(hc, http.MethodPost, url+"/v1/orders/"+id+"/pay", apiKey, key, client.PayRequest{PaymentMethod: "pm_ok"})
		})
		counts, _, fresh := sameIntentAnswers(t, answers, http.StatusOK)
		t.Logf("answers: %s", counts)
		if got := counts["200"] + counts["409 request_in_progress"]; got != sameKeyClients {
			t.Errorf("answers = %s; want only 200 and 409 request_in_progress", counts)
		}
		if fresh != 1 {
			t.Errorf("200s without Idempotent-Replayed = %d, want exactly 1", fresh)
		}
		// Clients that saw 409 get the outcome by retrying the same key.
		final := send(hc, http.MethodPost, c.instances[2].url+"/v1/orders/"+id+"/pay", apiKey, key, client.PayRequest{PaymentMethod: "pm_ok"})
		if final.status != http.StatusOK || !final.replayed() || decodeOrder(t, final).Status != "PAID" {
			t.Errorf("retry after the storm = %s, want the replayed 200 PAID", final)
		}
		charges := c.channel.chargesByOrder(t)[id]
		if len(charges) != 1 || charges[0].Status != "succeeded" || charges[0].Requests != 1 {
			t.Errorf("channel charges for the order = %+v, want exactly 1 succeeded charge from 1 request", charges)
		}
		if got := recordStates(t, db, "order.pay"); got["SUCCEEDED"] != 1 || len(got) != 1 {
			t.Errorf("order.pay records by state = %v, want {SUCCEEDED: 1}", got)
		}
	})

	t.Run(fmt.Sprintf("%d different keys paying one order make one charge", distinctKeys), func(t *testing.T) {
		before := recordStates(t, db, "order.pay")
		id := create(2)
		answers := storm(distinctKeys, c.urls(), func(_ int, url string) answer {
			return send(hc, http.MethodPost, url+"/v1/orders/"+id+"/pay", apiKey, client.NewKey(), client.PayRequest{PaymentMethod: "pm_ok"})
		})
		counts := tally{}
		for _, a := range answers {
			counts[a.label()]++
		}
		t.Logf("answers: %s", counts)
		if counts["200"] != 1 || counts["409 invalid_transition"] != distinctKeys-1 {
			t.Errorf("answers = %s; want exactly one 200 and %d × 409 invalid_transition", counts, distinctKeys-1)
		}
		charges := c.channel.chargesByOrder(t)[id]
		if len(charges) != 1 || charges[0].Status != "succeeded" || charges[0].Requests != 1 {
			t.Errorf("channel charges for the order = %+v, want exactly 1 succeeded charge from 1 request", charges)
		}
		after := recordStates(t, db, "order.pay")
		if after["SUCCEEDED"]-before["SUCCEEDED"] != 1 || after["FAILED_FINAL"]-before["FAILED_FINAL"] != distinctKeys-1 || len(after) != 2 {
			t.Errorf("order.pay records by state = %v (before: %v), want one more SUCCEEDED and %d more FAILED_FINAL",
				after, before, distinctKeys-1)
		}
	})

	if s := c.channel.stats(t); s.Charges != 2 {
		t.Errorf("channel charges in all = %d, want 2 (one per order): %+v", s.Charges, s)
	}
}

// sameIntentAnswers tallies the answers to copies of one intent and checks
// that every success with status is the first one byte for byte, Location
// included. It returns the tally, the first success and how many successes
// were not marked replayed (exactly one should be: the first real result).
func sameIntentAnswers(t *testing.T, answers []answer, status int) (counts tally, first *answer, fresh int) {
	t.Helper()
	counts = tally{}
	for i := range answers {
		a := &answers[i]
		counts[a.label()]++
		if a.err != nil || a.status != status {
			continue
		}
		if !a.replayed() {
			fresh++
		}
		if first == nil {
			first = a
			continue
		}
		if !bytes.Equal(a.body, first.body) || a.header.Get("Location") != first.header.Get("Location") {
			t.Errorf("%d #%d differs from the first %d:\n%s\nLocation %s\nvs\n%s\nLocation %s",
				status, i, status, a.body, a.header.Get("Location"), first.body, first.header.Get("Location"))
		}
	}
	return counts, first, fresh
}
