//go:build cluster

package messaging_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testproc"
)

// The broker beyond one node: three NATS servers as a JetStream cluster on
// loopback (each its own store, sync_interval: always, as docs/scaling.md
// recommends), the service's streams at replicas 3 (NATS_STREAM_REPLICAS),
// two service instances sharing one payment channel, and a backlog of
// commands being consumed when a node is SIGKILLed: the stream's leader in
// one case, the durable consumer's leader in the other. Every command a
// client had a publish acknowledgement for converges exactly once: one
// order per create key, one charge per pay key, a result for each, nothing
// dead-lettered. The test reports how long the stream (or consumer) had no
// leader and how many redeliveries the loss caused.
//
// The server is built from the nats-server module the service already
// depends on (Debian's nats-server 2.9 predates sync_interval).

const clusterServicePassword = "cluster-service-secret"

func TestCommandsConvergeWhenABrokerNodeDies(t *testing.T) {
	bin := buildNATSServer(t)
	for _, victim := range []string{"stream leader", "consumer leader"} {
		t.Run("killing the "+victim, func(t *testing.T) { clusterCase(t, bin, victim) })
	}
}

func buildNATSServer(t *testing.T) string {
	t.Helper()
	bins, err := testproc.Build(t.TempDir(), "github.com/nats-io/nats-server/v2")
	if err != nil {
		t.Fatalf("build nats-server from the module: %v", err)
	}
	return bins["github.com/nats-io/nats-server/v2"]
}

type natsNode struct {
	name, clientAddr string
	proc             *testproc.Process
}

// startNATSCluster starts three nodes routed to each other.
func startNATSCluster(t *testing.T, bin string) []*natsNode {
	t.Helper()
	var nodes []*natsNode
	var routes []string
	clusterAddrs := make([]string, 3)
	for i := range 3 {
		clusterAddrs[i] = testproc.FreeAddr(t)
		routes = append(routes, "nats-route://"+clusterAddrs[i])
	}
	users := fmt.Sprintf(`{user: %s, password: %s}`, messaging.ServiceUser, clusterServicePassword)
	for tenant, key := range tenants {
		users += fmt.Sprintf(`
    {user: %s, password: %s, permissions: {publish: {allow: ["%s>"]}, subscribe: {allow: ["%s%s.>", "%s%s.>", "%s.>"]}}}`,
			tenant, key, messaging.CommandPrefix+tenant+".", messaging.ResultPrefix, tenant, messaging.EventPrefix, tenant, messaging.InboxPrefix(tenant))
	}
	for i := range 3 {
		dir := t.TempDir()
		n := &natsNode{name: fmt.Sprintf("n%d", i+1), clientAddr: testproc.FreeAddr(t)}
		host, port, _ := strings.Cut(n.clientAddr, ":")
		chost, cport, _ := strings.Cut(clusterAddrs[i], ":")
		conf := fmt.Sprintf(`server_name: %s
host: %s
port: %s
jetstream { store_dir: %q, sync_interval: always }
cluster { name: orders, host: %s, port: %s, routes: [%s] }
authorization { users: [
    %s
] }
`, n.name, host, port, filepath.Join(dir, "js"), chost, cport, strings.Join(routes, ", "), users)
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		n.start(t, bin, path)
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		waitFor(t, n.name+" listening", 30*time.Second, func() bool {
			conn, err := net.Dial("tcp", n.clientAddr)
			if err == nil {
				conn.Close()
			}
			return err == nil
		})
	}
	return nodes
}

func (n *natsNode) start(t *testing.T, bin, conf string) {
	t.Helper()
	log, err := os.Create(conf + ".log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = log, log
	p, err := testproc.Launch(n.name, cmd)
	log.Close()
	if err != nil {
		t.Fatal(err)
	}
	n.proc = p
	t.Cleanup(func() {
		p.Kill(t)
		if t.Failed() {
			out, _ := os.ReadFile(conf + ".log")
			if len(out) > 4<<10 {
				out = out[len(out)-4<<10:]
			}
			t.Logf("%s log:\n%s", n.name, out)
		}
	})
}

func clusterCase(t *testing.T, bin, victim string) {
	nodes := startNATSCluster(t, bin)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, fmt.Sprintf("nats://%s:%s@%s", messaging.ServiceUser, clusterServicePassword, n.clientAddr))
	}
	natsURL := strings.Join(urls, ",")
	operator, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(operator.Close)
	ojs, _ := jetstream.New(operator)
	waitFor(t, "the cluster's JetStream", 60*time.Second, func() bool {
		_, err := ojs.AccountInfo(context.Background())
		return err == nil
	})

	env := map[string]string{"NATS_URL": natsURL, "NATS_STREAM_REPLICAS": "3", "COMMAND_ACK_WAIT": "2s",
		"COMMAND_MAX_DELIVER": "10", "COMMAND_BACKOFF": "50ms", "COMMAND_BACKOFF_MAX": "1s"}
	first := apptest.Start(t, dbURL, env)
	second := apptest.Start(t, dbURL, map[string]string{"NATS_URL": natsURL, "NATS_STREAM_REPLICAS": "3", "COMMAND_ACK_WAIT": "2s",
		"COMMAND_MAX_DELIVER": "10", "COMMAND_BACKOFF": "50ms", "COMMAND_BACKOFF_MAX": "1s",
		"PAYMENT_CHANNEL_URL": "http://" + first.ChannelAddr})
	c := apptest.NewClient(first, apptest.KeyAcme)
	if s, err := ojs.Stream(context.Background(), messaging.CommandsStream); err != nil || s.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("ORDER_COMMANDS: %v (replicas %d)", err, s.CachedInfo().Config.Replicas)
	}

	// The orders to pay, made over HTTP.
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	const n = 60
	orderIDs := make([]string, n)
	for i := range n {
		r := c.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("cl-order-%s-%d", run, i), map[string]any{"customer_id": "cus_cl_" + run,
			"currency": "EUR", "items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 100}}})
		if r.Status != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, r.Status, r.Body)
		}
		orderIDs[i] = r.JSON(t)["id"].(string)
	}

	acme, err := nats.Connect(strings.ReplaceAll(natsURL, messaging.ServiceUser+":"+clusterServicePassword, "acme:"+tenants["acme"]),
		nats.CustomInboxPrefix(messaging.InboxPrefix("acme")), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(acme.Close)
	ajs, _ := jetstream.New(acme)
	// publish sends a command until JetStream acknowledges it, as a client
	// that wants its command kept does; it returns whether it was.
	publish := func(subject, key, body string) bool {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			m := nats.NewMsg(subject)
			m.Header.Set(messaging.HeaderKey, key)
			m.Data = []byte(body)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := ajs.PublishMsg(ctx, m)
			cancel()
			if err == nil {
				return true
			}
		}
		return false
	}

	var acked sync.Map // key -> order id, for a pay; "" for a create
	publishAll := func(from, to int) {
		for i := from; i < to; i++ {
			payKey := fmt.Sprintf("cl-pay-%s-%d", run, i)
			if publish(messaging.CommandSubject("acme", "pay"), payKey, fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, orderIDs[i])) {
				acked.Store(payKey, orderIDs[i])
			}
			createKey := fmt.Sprintf("cl-create-%s-%d", run, i)
			if publish(messaging.CommandSubject("acme", "create"), createKey, fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":5}]}`, createKey)) {
				acked.Store(createKey, "")
			}
		}
	}
	publishAll(0, n/2)

	// Kill the victim while the backlog is consumed.
	leaderOf := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if victim == "stream leader" {
			s, err := ojs.Stream(ctx, messaging.CommandsStream)
			if err != nil || s.CachedInfo().Cluster == nil {
				return ""
			}
			return s.CachedInfo().Cluster.Leader
		}
		cons, err := ojs.Consumer(ctx, messaging.CommandsStream, messaging.ConsumerFor("acme"))
		if err != nil || cons.CachedInfo().Cluster == nil {
			return ""
		}
		return cons.CachedInfo().Cluster.Leader
	}
	leader := leaderOf()
	var dead *natsNode
	for _, node := range nodes {
		if node.name == leader {
			dead = node
		}
	}
	if dead == nil {
		t.Fatalf("no node leads the %s (%q)", victim, leader)
	}
	dead.proc.Kill(t)
	killed := time.Now()
	for leaderOf() == "" || leaderOf() == dead.name {
		if time.Since(killed) > 60*time.Second {
			t.Fatalf("the %s had no new leader 60s after %s died", victim, dead.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	leaderless := time.Since(killed)
	publishAll(n/2, n)

	// Every acknowledged command converges, exactly once.
	var keys []string
	acked.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	waitFor(t, "every acknowledged command answered", 120*time.Second, func() bool {
		return apptest.Count(t, first.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key IN ? AND state IN ('SUCCEEDED', 'FAILED_FINAL')", keys) == int64(len(keys))
	})
	acked.Range(func(k, v any) bool {
		key, orderID := k.(string), v.(string)
		if orderID == "" {
			if got := apptest.Count(t, first.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); got != 1 {
				t.Errorf("create %s made %d orders, want 1", key, got)
			}
			return true
		}
		if got := apptest.Count(t, first.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND status = 'succeeded'", orderID); got != 1 {
			t.Errorf("pay %s made %d charges, want 1", key, got)
		}
		return true
	})
	if got, want := first.Channel.Stats().Charges, int64(n); got != want {
		t.Errorf("the channel made %d charges for %d pays", got, want)
	}
	results := map[string]int{}
	waitFor(t, "a result for every command", 60*time.Second, func() bool {
		results = resultsByKey(t, ojs)
		for _, k := range keys {
			if results[k] == 0 {
				return false
			}
		}
		return true
	})
	if depth := apptest.Metric(t, first.URL(), "orderservice_dlq_depth"); depth != 0 {
		t.Errorf("orderservice_dlq_depth = %v, want 0", depth)
	}
	redelivered := 0.0
	for _, m := range []*app.Main{first, second} {
		for _, op := range []string{"create", "pay"} {
			redelivered += metricWith(t, m.URL(), "orderservice_messages_redelivered_total", `op="`+op+`"`)
		}
	}
	t.Logf("%s: killed %s (%s); %d commands acknowledged of %d sent; no leader for %s; %v redeliveries across both instances",
		victim, dead.name, leader, len(keys), 2*n, leaderless.Round(time.Millisecond), redelivered)
}

// resultsByKey counts the results ORDER_RESULTS keeps, by Idempotency-Key.
func resultsByKey(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, messaging.ResultsStream)
	if err != nil {
		return nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out[m.Header.Get(messaging.HeaderKey)]++
		}
	}
	return out
}

// metricWith reads one labelled series from a /metrics page.
func metricWith(t *testing.T, baseURL, name, label string) float64 {
	t.Helper()
	res, err := http.Get(baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var page strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := res.Body.Read(buf)
		page.WriteString(string(buf[:n]))
		if err != nil {
			break
		}
	}
	for _, line := range strings.Split(page.String(), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			var v float64
			fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
			return v
		}
	}
	return 0
}

// waitFor polls cond until it holds; the bound only keeps a broken run
// from hanging.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
	}
}
