//go:build faults

package faults

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// Timings every service instance of the suite runs with: a lease that
// outlives one channel call by a second, and a brisk sweeper.
const (
	lease          = 3 * time.Second
	channelTimeout = 2 * time.Second
	sweepInterval  = 500 * time.Millisecond
	retryAfter     = time.Second
	// asyncDelay is how long the channel takes to settle pm_async_* charges.
	asyncDelay = 300 * time.Millisecond
	apiKey     = "faults-key-acme"
	tenant     = "acme"
)

// startProcess runs a binary of the suite, or fails the test.
func startProcess(t *testing.T, name, bin string, env []string) *testproc.Process {
	t.Helper()
	p, err := testproc.Start(t, name, bin, env)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitOK waits until url answers 200, or fails the test.
func waitOK(t *testing.T, url string, within time.Duration) {
	t.Helper()
	if err := testproc.WaitOK(url, within); err != nil {
		t.Fatal(err)
	}
}

// channelProc is the external mock payment channel.
type channelProc struct {
	*testproc.Process
	url string
	env []string
}

// startChannel runs the paymentchannel binary on a fresh database of its
// own; slowDelay is how long pm_slow takes.
func startChannel(t *testing.T, slowDelay time.Duration, extra ...string) *channelProc {
	t.Helper()
	addr := testproc.FreeAddr(t)
	env := append([]string{"HTTP_ADDR=" + addr, "LOG_LEVEL=warn", "PAYMENT_SLOW_DELAY=" + slowDelay.String(),
		"PAYMENT_ASYNC_DELAY=" + asyncDelay.String(),
		"CHANNEL_DATABASE_URL=" + testdb.Fresh(t, "faults_channel")}, extra...) // a ledger of its own, empty
	ch := &channelProc{Process: startProcess(t, "paymentchannel", bins.paymentchannel, env), url: "http://" + addr, env: env}
	waitOK(t, ch.url+"/healthz", 20*time.Second)
	return ch
}

// restart SIGKILLs the channel and starts it again on the same address and
// ledger, as a crashed acquirer that comes back would. Its faults are reset
// (they live in memory); its charges are not.
func (c *channelProc) restart(t *testing.T) error {
	c.Kill(t)
	p, err := testproc.Start(t, c.Name, bins.paymentchannel, c.env)
	if err != nil {
		return err
	}
	c.Process = p
	return testproc.WaitOK(c.url+"/healthz", 20*time.Second)
}

// setLatency makes the channel wait before handling every /v1 request.
func (c *channelProc) setLatency(t *testing.T, latency time.Duration) {
	t.Helper()
	c.setFaults(t, map[string]any{"latency_ms": latency.Milliseconds()})
}

// setFaults replaces the channel's own faults (lost_response_rate,
// unavailable_rate, latency_ms, latency_jitter_ms); nil clears them.
func (c *channelProc) setFaults(t *testing.T, faults map[string]any) {
	t.Helper()
	if faults == nil {
		faults = map[string]any{}
	}
	a := send(adminHTTP, http.MethodPost, c.url+"/admin/faults", "", "", faults)
	if a.status != http.StatusOK {
		t.Fatalf("set channel faults %v: %s", faults, a)
	}
}

// stats is the channel's counters, GET /admin/stats.
func (c *channelProc) stats(t *testing.T) mockchannel.Stats {
	t.Helper()
	var s mockchannel.Stats
	c.get(t, "/admin/stats", &s)
	return s
}

// chargeRecord is one entry of GET /admin/charges.
type chargeRecord struct {
	ID             string `json:"id"`
	Status         string `json:"status"`
	Amount         int64  `json:"amount"`
	Reference      string `json:"reference"`
	IdempotencyKey string `json:"idempotency_key"`
	Requests       int    `json:"requests"`
	AmountRefunded int64  `json:"amount_refunded"`
}

// chargesByOrder groups the channel's charges (succeeded or declined) by
// their reference, which is the order id.
func (c *channelProc) chargesByOrder(t *testing.T) map[string][]chargeRecord {
	t.Helper()
	var body struct {
		Charges []chargeRecord `json:"charges"`
	}
	c.get(t, "/admin/charges", &body)
	out := map[string][]chargeRecord{}
	for _, ch := range body.Charges {
		out[ch.Reference] = append(out[ch.Reference], ch)
	}
	return out
}

func (c *channelProc) get(t *testing.T, path string, v any) {
	t.Helper()
	a := send(adminHTTP, http.MethodGet, c.url+path, "", "", nil)
	if a.status != http.StatusOK || json.Unmarshal(a.body, v) != nil {
		t.Fatalf("channel %s: %s", path, a)
	}
}

// serviceProc is one orderservice instance.
type serviceProc struct {
	*testproc.Process
	url string
	env []string
}

// serviceEnv is the environment of an instance listening on addr.
func serviceEnv(dbURL, addr, channelURL string, extra ...string) []string {
	env := []string{
		"DATABASE_URL=" + dbURL,
		"HTTP_ADDR=" + addr,
		"PAYMENT_CHANNEL_URL=" + channelURL,
		"API_KEYS=" + tenant + "=" + apiKey,
		"IDEMPOTENCY_LEASE=" + lease.String(),
		"PAYMENT_CHANNEL_TIMEOUT=" + channelTimeout.String(),
		"PAYMENT_RETRY_AFTER=" + retryAfter.String(),
		"SWEEP_INTERVAL=" + sweepInterval.String(),
		"DB_MAX_CONNS=10",
		"SHUTDOWN_TIMEOUT=5s",
		"LOG_LEVEL=warn",
		// Each instance runs an embedded NATS server of its own on a free port.
		"NATS_EMBEDDED_ADDR=127.0.0.1:0",
		"NATS_STORE_DIR=" + filepath.Join(os.TempDir(), "orderservice-faults-nats", strings.ReplaceAll(addr, ":", "_")),
		// The suite's storms prove exactly-once, not load shedding (which
		// internal/httpapi and make bench cover): queue rather than refuse.
		"HTTP_QUEUE_TIMEOUT=30s",
	}
	return append(env, extra...)
}

// startService runs one orderservice instance and waits until it is ready.
func startService(t *testing.T, name string, env []string) *serviceProc {
	t.Helper()
	addr := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "HTTP_ADDR="); ok {
			addr = v
		}
	}
	s := &serviceProc{Process: startProcess(t, name, bins.orderservice, env), url: "http://" + addr, env: env}
	waitOK(t, s.url+"/readyz", 30*time.Second)
	return s
}

// restart starts a new process of the instance on the same address and
// waits until it is ready. It may run in any goroutine, and returns the
// error; the caller must not touch s until it returned.
func (s *serviceProc) restart(t *testing.T) error {
	if !s.Exited() {
		return fmt.Errorf("restart of %s while it still runs", s.Name)
	}
	p, err := testproc.Start(t, s.Name, bins.orderservice, s.env)
	if err != nil {
		return err
	}
	s.Process = p
	return testproc.WaitOK(s.url+"/readyz", 30*time.Second)
}

// cluster is one external channel and n service instances sharing a fresh
// database.
type cluster struct {
	dbURL     string
	channel   *channelProc
	instances []*serviceProc
}

// startCluster creates the database and starts the processes; extra is
// added to every instance's environment. The channel delivers its
// webhooks to the first instance, as it would to one address in
// production; while that instance is down, it delivers them again later.
func startCluster(t *testing.T, n int, slowDelay time.Duration, extra ...string) *cluster {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = testproc.FreeAddr(t)
	}
	c := &cluster{dbURL: freshDB(t),
		channel: startChannel(t, slowDelay, "CHANNEL_WEBHOOK_URL=http://"+addrs[0]+"/webhooks/payment-channel")}
	for i, addr := range addrs {
		env := serviceEnv(c.dbURL, addr, c.channel.url, extra...)
		c.instances = append(c.instances, startService(t, fmt.Sprintf("orderservice-%d", i+1), env))
	}
	return c
}

// freshDB creates and migrates a database for one scenario, dropped when it
// ends.
func freshDB(t *testing.T) string {
	t.Helper()
	url, drop, err := testdb.Create("faults")
	if err != nil {
		t.Fatalf("fresh database: %v", err)
	}
	t.Cleanup(drop)
	return url
}

// tally counts answers by "status code" for the log and for assertions.
type tally map[string]int

func (tl tally) String() string {
	keys := make([]string, 0, len(tl))
	for k := range tl {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, tl[k])
	}
	return strings.Join(parts, ", ")
}
