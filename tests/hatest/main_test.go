//go:build ha

package hatest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// ha is the cluster and the network the package's tests share.
var ha struct {
	cluster *cluster
	proxies map[string]*pgProxy // by node name: the service reaches each node through one
	// serviceURL names both nodes through their proxies, as a deployment
	// names its database servers: the service must find the primary.
	serviceURL string
	// directURL names both nodes without proxies, for checking outcomes.
	directURL  string
	channel    *mockchannel.Server
	channelURL string
}

// Tenants of the scenarios: each counts only its own orders.
var tenants = map[string]string{"storm": "ha-key-storm", "unknown": "ha-key-unknown", "switch": "ha-key-switch", "replica": "ha-key-replica"}

const dbName = "orderservice_ha"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	dir := os.Getenv("HA_DIR") // the Makefile passes one, to clean up after a crashed run
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "orderservice-ha-"); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}

	var once sync.Once
	var c *cluster
	stop := func() {
		once.Do(func() {
			if c != nil {
				if err := c.close(); err != nil {
					fmt.Fprintln(os.Stderr, "FAIL:", err)
					code = 1
				}
			}
			for _, p := range ha.proxies {
				p.close()
			}
			if code == 0 {
				os.RemoveAll(dir)
			} else {
				fmt.Fprintf(os.Stderr, "cluster logs kept in %s\n", dir)
			}
		})
	}
	defer stop()
	// An interrupted run still leaves nothing running.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		code = 1
		stop()
		fmt.Fprintln(os.Stderr, "stopped by", s)
		os.Exit(1)
	}()

	start := time.Now()
	var err error
	c, err = startCluster(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: start the HA cluster:", err)
		if c != nil {
			for _, n := range c.nodes {
				fmt.Fprintf(os.Stderr, "--- %s\n%s\n", n.name, c.logTail(n.name, 30))
			}
		}
		return 1
	}
	ha.cluster = c
	leader, _ := c.leader()
	fmt.Printf("HA: cluster of %d nodes up in %s (leader %s, synchronous standby streaming)\n",
		len(c.nodes), time.Since(start).Round(100*time.Millisecond), leader.name)

	ha.proxies = map[string]*pgProxy{}
	var viaProxy, direct []string
	for _, n := range c.nodes {
		p, err := newPGProxy(n.pgAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		ha.proxies[n.name] = p
		viaProxy, direct = append(viaProxy, p.addr()), append(direct, n.pgAddr)
	}
	ha.serviceURL = "postgres://postgres@" + strings.Join(viaProxy, ",") + "/" + dbName + "?sslmode=disable&target_session_attrs=read-write"
	ha.directURL = "postgres://postgres@" + strings.Join(direct, ",") + "/" + dbName + "?sslmode=disable&target_session_attrs=read-write"

	// One payment channel for every instance, outside the failover: it is
	// the acquirer whose charges we count.
	// Its ledger lives on the machine's own PostgreSQL, not on the cluster.
	channelDB, dropChannelDB := testdb.NewURL("ha_channel")
	defer dropChannelDB()
	if ha.channel, err = mockchannel.Open(context.Background(), channelDB, mockchannel.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: payment channel:", err)
		return 1
	}
	defer ha.channel.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	srv := &http.Server{Handler: ha.channel.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	ha.channelURL = "http://" + ln.Addr().String()

	code = m.Run()
	if code != 0 {
		for _, n := range c.nodes {
			fmt.Fprintf(os.Stderr, "--- %s (last lines)\n%s\n", n.name, c.logTail(n.name, 20))
		}
	}
	return code
}

// healthy makes sure both nodes run, a leader and its synchronous standby,
// before a scenario breaks something.
func healthy(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := ha.cluster.waitHealthy(90 * time.Second); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("cluster healthy again after %s", d.Round(100*time.Millisecond))
	}
}

func apiKeys() string {
	var pairs []string
	for tenant, key := range tenants {
		pairs = append(pairs, tenant+"="+key)
	}
	return strings.Join(pairs, ",")
}

// instanceConfig is a service instance on the HA cluster.
func instanceConfig(t *testing.T, dbURL string, env map[string]string) app.Config {
	base := map[string]string{
		"API_KEYS":             apiKeys(),
		"PAYMENT_CHANNEL_URL":  ha.channelURL,
		"DB_CONN_MAX_LIFETIME": "15s",
		"DB_START_TIMEOUT":     "90s",
		"DB_MAX_CONNS":         "16",
	}
	for k, v := range env {
		base[k] = v
	}
	return apptest.Config(t, dbURL, base)
}

// startInstance starts a service instance in process and closes it when
// the test ends; it logs errors only (a failover makes many warnings).
func startInstance(t *testing.T, env map[string]string) *app.Main {
	t.Helper()
	m, err := app.Start(context.Background(), instanceConfig(t, ha.serviceURL, env), testLogger(t))
	if err != nil {
		t.Fatalf("start service: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("close service: %v", err)
		}
	})
	return m
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// figure logs one measured figure in a form `make test-ha` output can be
// searched for.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("HA: "+format, args...)
}

// waitPrimary polls until n is the writable primary and returns when.
func waitPrimary(t *testing.T, n *node, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ha.cluster.isPrimary(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become the primary within %s", n.name, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Now()
}

func ready(url string) int {
	res, err := (&http.Client{Timeout: 3 * time.Second}).Get(url + "/readyz")
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// after is t - t0 for a figure, "none" when t never happened.
func after(t0, t time.Time) string {
	if t.IsZero() || t.Before(t0) {
		return "none"
	}
	return t.Sub(t0).Round(10 * time.Millisecond).String()
}

// commitsInDoubt gathers, over both nodes, the COMMITs the server got whose
// answer never reached the service since the last call.
func commitsInDoubt() [][]string {
	var d [][]string
	for _, p := range ha.proxies {
		d = append(d, p.commitsInDoubt()...)
	}
	return d
}
