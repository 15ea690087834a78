package app_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

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

// The real binary is SIGKILLed while a pay waits at a slow channel (a
// binary of its own, whose ledger outlives the service); the binary
// started again finds the intent, whose lease has run out, and its
// sweeper finishes it with the one charge. The client's retry replays it.
func TestKilledServiceRecoversPaymentAfterRestart(t *testing.T) {
	isolateMoney(t)
	bins, err := testproc.Build(t.TempDir(), orderservicePkg, paymentchannelPkg)
	if err != nil {
		t.Fatal(err)
	}
	channelAddr, apiAddr := testproc.FreeAddr(t), testproc.FreeAddr(t)
	startBinary(t, "paymentchannel", bins[paymentchannelPkg], "http://"+channelAddr+"/healthz", "HTTP_ADDR="+channelAddr, "LOG_LEVEL=warn",
		"CHANNEL_DATABASE_URL="+testdb.Fresh(t, "app_channel"))
	serviceEnv := []string{
		"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + apiAddr, "PAYMENT_CHANNEL_URL=http://" + channelAddr,
		"IDEMPOTENCY_LEASE=3s", "PAYMENT_CHANNEL_TIMEOUT=2s", "SWEEP_INTERVAL=200ms",
		"API_KEYS=acme=" + apptest.KeyAcme, "LOG_LEVEL=warn",
		"NATS_EMBEDDED_ADDR=127.0.0.1:0", "NATS_STORE_DIR=" + t.TempDir(),
	}
	service := startBinary(t, "orderservice-1", bins[orderservicePkg], "http://"+apiAddr+"/readyz", serviceEnv...)

	c := &apptest.Client{BaseURL: "http://" + apiAddr, APIKey: apptest.KeyAcme, HTTP: &http.Client{Timeout: 30 * time.Second}}
	admin := &apptest.Client{BaseURL: "http://" + channelAddr, HTTP: &http.Client{Timeout: 10 * time.Second}}
	id := placeOrder(t, c)
	key := newKey("R2-killed")
	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"latency_ms": 1500}); r.Status != http.StatusOK {
		t.Fatalf("set channel faults: %d %s", r.Status, r.Body)
	}

	answered := make(chan string, 1)
	go func() {
		r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith("pm_ok"), nil)
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
	apptest.Eventually(t, 20*time.Second, "PAID after the restart", func() (bool, string) {
		st := statusOf(t, c, id)
		return st == "PAID", st
	})
	if got := apptest.ChannelStats(t, admin).Charges; got != 1 {
		t.Errorf("channel charges = %d, want exactly 1", got)
	}
	retry := pay(t, c, id, key, "pm_ok")
	if retry.Status != http.StatusOK || retry.JSON(t)["status"] != "PAID" {
		t.Fatalf("client retry after the restart = %d %s", retry.Status, retry.Body)
	}
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("client retry was not a replay of the recovered outcome: %v", retry.Header)
	}
	stats := apptest.ChannelStats(t, admin)
	t.Logf("channel after recovery and retry: %+v", stats)
	if stats.Charges != 1 || stats.AmountCharged != 2500 {
		t.Errorf("channel after the retry: %+v, want 1 charge of 2500", stats)
	}
	if got, want := historyOf(t, c, id), "create,pay,payment_succeeded"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
}
