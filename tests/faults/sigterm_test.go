//go:build faults

package faults

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSIGTERMDuringABurstAnswersEveryAcceptedRequest sends SIGTERM to the
// real binary while payments are inside the channel's slow path: the
// service stops accepting, lets every accepted request finish, exits 0, and
// leaves no record PROCESSING because of the shutdown.
func TestSIGTERMDuringABurstAnswersEveryAcceptedRequest(t *testing.T) {
	c := startCluster(t, 1, 500*time.Millisecond)
	svc := c.instances[0]
	db := openDB(t, c.dbURL)
	// Every request on its own connection: it is either accepted or refused,
	// never lost on a keep-alive connection the server closed while idle.
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	const n = 20
	ids := make([]string, n)
	for i := range ids {
		a := send(hc, http.MethodPost, svc.url+"/v1/orders", apiKey, fmt.Sprintf("term-create-%d", i), createBody("term", i))
		if a.status != http.StatusCreated {
			t.Fatalf("create: %s", a)
		}
		ids[i] = decodeOrder(t, a).ID
	}

	answers := make([]answer, 2*n)
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i < n {
				answers[i] = send(hc, http.MethodPost, svc.url+"/v1/orders/"+ids[i]+"/pay", apiKey,
					fmt.Sprintf("term-pay-%d", i), map[string]string{"payment_method": "pm_slow"})
				return
			}
			answers[i] = send(hc, http.MethodPost, svc.url+"/v1/orders", apiKey, fmt.Sprintf("term-new-%d", i), createBody("term-new", i))
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); c.channel.stats(t).Requests < n/2; {
		if time.Now().After(deadline) {
			t.Fatal("the payments never reached the channel")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := svc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	select {
	case <-svc.Done:
	case <-time.After(15 * time.Second):
		t.Fatal("the service did not exit after SIGTERM")
	}
	if code := svc.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}

	got := tally{}
	paid := 0
	for i, a := range answers {
		switch {
		case a.err != nil && strings.Contains(a.err.Error(), "connection refused"):
			got["refused (never accepted)"]++
		case a.err != nil:
			t.Errorf("request %d was accepted and then lost: %v", i, a.err)
		case a.status >= 500:
			t.Errorf("request %d: %s", i, a)
		default:
			got[a.label()]++
			if i < n && a.status == http.StatusOK {
				paid++
			}
		}
	}
	t.Logf("answers: %s", got)
	if paid < n/2 {
		t.Errorf("only %d payments were answered 200; the shutdown did not wait for them", paid)
	}
	if left := count(t, db, "SELECT count(*) FROM idempotency_records WHERE state = 'PROCESSING'"); left != 0 {
		t.Errorf("%d records left PROCESSING by the shutdown", left)
	}
	if charged, orders := c.channel.stats(t).Charges, count(t, db, "SELECT count(*) FROM orders WHERE status = 'PAID'"); int(charged) != orders {
		t.Errorf("channel charged %d, %d orders PAID", charged, orders)
	}
}
