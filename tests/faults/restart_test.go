//go:build faults

package faults

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/tests/testdb"
)

// loadIntent is one create-and-pay of the load that runs across the
// restart, with when each step was first acknowledged.
type loadIntent struct {
	n          int
	orderID    string
	createdAt  time.Time // first 201
	paidAt     time.Time // first 200
	unfinished string    // why it did not complete, if it did not
}

// attemptLog is every answer the load got, with when it arrived.
type attemptLog struct {
	mu      sync.Mutex
	answers []timedAnswer
}

type timedAnswer struct {
	at    time.Time
	label string
	took  time.Duration
	path  string
}

func (l *attemptLog) add(path string, a answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers = append(l.answers, timedAnswer{at: time.Now(), label: a.label(), took: a.took, path: path})
}

func (l *attemptLog) all() []timedAnswer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]timedAnswer(nil), l.answers...)
}

func TestPostgresRestartAnswers503ThenRecoversLosingNothing(t *testing.T) {
	before, after := 2*time.Second, 1500*time.Millisecond
	workers := 6
	if testing.Short() {
		before, after, workers = time.Second, time.Second, 4
	}
	pgVersion := localCluster(t)
	c := startCluster(t, 2, time.Second)
	// Attempts must end well within this: the statement timeout is 5s.
	const attemptTimeout = 8 * time.Second
	hc := rawHTTP(attemptTimeout)
	log := &attemptLog{}
	var seq atomic.Int64
	stop := make(chan struct{})
	var mu sync.Mutex
	var intents []*loadIntent
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				in := &loadIntent{n: int(seq.Add(1))}
				mu.Lock()
				intents = append(intents, in)
				mu.Unlock()
				runLoadIntent(hc, c.instances[w%2].url, c.instances[(w+1)%2].url, in, log)
			}
		})
	}

	// Readiness probes of every instance, throughout.
	type probe struct {
		at       time.Time
		instance int
		status   int
	}
	var probes []probe
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		phc := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			for i, s := range c.instances {
				status := 0
				if res, err := phc.Get(s.url + "/readyz"); err == nil {
					res.Body.Close()
					status = res.StatusCode
				}
				probes = append(probes, probe{time.Now(), i, status})
			}
		}
	}()

	// Should the restart fail half-way, bring the server back for everyone.
	t.Cleanup(func() {
		if !pgReady() {
			out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", pgVersion, "main", "start").CombinedOutput()
			t.Logf("PostgreSQL was down after the test; pg_ctlcluster start: %v %s", err, out)
		}
	})
	time.Sleep(before)
	restartBegan := time.Now()
	t.Logf("restarting PostgreSQL %s under load from %d workers", pgVersion, workers)
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", pgVersion, "main", "restart").CombinedOutput()
	if err != nil {
		t.Fatalf("pg_ctlcluster restart: %v\n%s", err, out)
	}
	restarted := time.Now()
	waitPGReady(t)
	pgReady := time.Now()
	for _, s := range c.instances {
		waitOK(t, s.url+"/readyz", 30*time.Second)
	}
	serviceReady := time.Now()
	t.Logf("restart command took %s; pg_isready after %s; every instance ready %s after the restart began, none restarted",
		restarted.Sub(restartBegan).Round(time.Millisecond), pgReady.Sub(restartBegan).Round(time.Millisecond),
		serviceReady.Sub(restartBegan).Round(time.Millisecond))
	time.Sleep(after)
	close(stop)
	wg.Wait()
	<-probesDone

	answers := log.all()
	all, down := tally{}, tally{}
	var slowest time.Duration
	for _, a := range answers {
		all[a.label]++
		slowest = max(slowest, a.took)
		if !a.at.Before(restartBegan) && a.at.Before(serviceReady) {
			down[a.label]++
		}
	}
	readyDown := map[int]int{}
	for _, p := range probes {
		if !p.at.Before(restartBegan) && p.at.Before(serviceReady) && p.status == http.StatusServiceUnavailable {
			readyDown[p.instance]++
		}
	}
	t.Logf("%d intents, %d attempts: %s; while PostgreSQL was down or coming back: %s; readyz 503s per instance: %v; slowest attempt %s",
		len(intents), len(answers), all, down, readyDown, slowest.Round(time.Millisecond))

	t.Run("the service answers 503 while PostgreSQL is down, and never hangs or fails otherwise", func(t *testing.T) {
		if down["503 service_unavailable"] == 0 {
			t.Errorf("no 503 service_unavailable while PostgreSQL restarted: %s", down)
		}
		for i := range c.instances {
			if readyDown[i] == 0 {
				t.Errorf("instance %d never answered readyz 503 while PostgreSQL restarted", i+1)
			}
		}
		for label, n := range all {
			switch label {
			case "200", "201", "409 request_in_progress", "503 service_unavailable":
			default:
				t.Errorf("%d attempts answered %q; want only 200, 201, 409 request_in_progress and 503 (an attempt may take at most %s)", n, label, attemptTimeout)
			}
		}
	})
	t.Run("every instance recovers by itself", func(t *testing.T) {
		for i, s := range c.instances {
			if s.Exited() {
				t.Errorf("instance %d exited", i+1)
			}
		}
	})

	db := openDB(t, c.dbURL)
	byOrder := c.channel.chargesByOrder(t)
	t.Run("nothing acknowledged before the restart is lost", func(t *testing.T) {
		created, paid := 0, 0
		for _, in := range intents {
			if in.createdAt.IsZero() || !in.createdAt.Before(restartBegan) {
				continue
			}
			created++
			if n := count(t, db, `SELECT count(*) FROM orders WHERE id = $1`, in.orderID); n != 1 {
				t.Errorf("order %s, acknowledged 201 before the restart, is gone", in.orderID)
			}
			if in.paidAt.IsZero() || !in.paidAt.Before(restartBegan) {
				continue
			}
			paid++
			if n := count(t, db, `SELECT count(*) FROM orders WHERE id = $1 AND status = 'PAID'`, in.orderID); n != 1 {
				t.Errorf("order %s, acknowledged paid before the restart, is not PAID", in.orderID)
			}
			if len(byOrder[in.orderID]) != 1 {
				t.Errorf("order %s, acknowledged paid before the restart, has %d charges", in.orderID, len(byOrder[in.orderID]))
			}
		}
		t.Logf("%d orders created and %d paid before the restart, all found after it", created, paid)
		if created == 0 || paid == 0 {
			t.Errorf("the load acknowledged %d creates and %d pays before the restart: too little to check", created, paid)
		}
	})
	t.Run("retried intents complete exactly once", func(t *testing.T) {
		for _, in := range intents {
			if in.unfinished != "" {
				t.Errorf("intent %d: %s", in.n, in.unfinished)
			}
		}
		if n := count(t, db, `SELECT count(*) FROM orders`); n != len(intents) {
			t.Errorf("orders = %d, want %d (one per create intent)", n, len(intents))
		}
		if n := count(t, db, `SELECT count(DISTINCT customer_id) FROM orders`); n != len(intents) {
			t.Errorf("customers with an order = %d, want %d", n, len(intents))
		}
		if n := count(t, db, `SELECT count(*) FROM orders WHERE status = 'PAID'`); n != len(intents) {
			t.Errorf("PAID orders = %d, want %d", n, len(intents))
		}
		if s := c.channel.stats(t); s.Charges != int64(len(intents)) {
			t.Errorf("channel charges = %d, want %d: %+v", s.Charges, len(intents), s)
		}
		for ref, charges := range byOrder {
			if len(charges) != 1 {
				t.Errorf("order %s has %d charges", ref, len(charges))
			}
		}
		if n := unfinishedRecords(t, db); n != 0 {
			t.Errorf("unfinished records = %d", n)
		}
	})
}

// runLoadIntent creates order in.n on one instance and pays it on the
// other, resending each step under its one key on 503, 409
// request_in_progress, 5xx or a transport error, for at most a minute.
func runLoadIntent(hc *http.Client, createURL, payURL string, in *loadIntent, log *attemptLog) {
	deadline := time.Now().Add(time.Minute)
	step := func(url string, body any, want int) (answer, bool) {
		key := client.NewKey()
		for time.Now().Before(deadline) {
			a := send(hc, http.MethodPost, url, apiKey, key, body)
			log.add(url, a)
			if a.err == nil && a.status == want {
				return a, true
			}
			if a.err == nil && a.status < 500 && !(a.status == http.StatusConflict && a.code() == client.CodeInProgress) {
				in.unfinished = fmt.Sprintf("POST %s answered %s", url, a)
				return a, false
			}
			time.Sleep(100 * time.Millisecond)
		}
		in.unfinished = fmt.Sprintf("POST %s not done within a minute", url)
		return answer{}, false
	}
	a, ok := step(createURL+"/v1/orders", createBody("restart", in.n), http.StatusCreated)
	if !ok {
		return
	}
	in.createdAt = time.Now()
	var o struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(a.body, &o); err != nil || o.ID == "" {
		in.unfinished = "create answered no order id: " + a.String()
		return
	}
	in.orderID = o.ID
	if _, ok := step(payURL+"/v1/orders/"+o.ID+"/pay", client.PayRequest{PaymentMethod: "pm_ok"}, http.StatusOK); ok {
		in.paidAt = time.Now()
	}
}

// localCluster is the version of the local PostgreSQL cluster that the
// tests' server URL names, for pg_ctlcluster. It fails the test when that
// server is not on this machine: restarting it is not ours to do.
func localCluster(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testdb.ServerURL())
	if err != nil {
		t.Fatalf("database server URL: %v", err)
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Fatalf("this scenario restarts PostgreSQL with pg_ctlcluster, so the test server must be local, not %s", u.Host)
	}
	entries, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(entries) != 1 {
		t.Fatalf("want exactly one cluster version under /etc/postgresql for pg_ctlcluster, found %d (%v)", len(entries), err)
	}
	return entries[0].Name()
}

// waitPGReady waits until pg_isready says the server accepts connections.
func waitPGReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !pgReady() {
		if time.Now().After(deadline) {
			t.Fatal("PostgreSQL not ready 60s after the restart (pg_isready)")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pgReady reports whether pg_isready says the test server accepts
// connections.
func pgReady() bool {
	u, err := url.Parse(testdb.ServerURL())
	if err != nil {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	return exec.Command("pg_isready", "-q", "-h", u.Hostname(), "-p", port).Run() == nil
}
