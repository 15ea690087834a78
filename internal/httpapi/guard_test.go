package httpapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// trickle opens a connection to srv and sends a create's headers as
// tenant, then its body a byte every every, until the body is sent or
// stop is closed; it returns the connection (closed at the test's end).
func trickle(t *testing.T, srv *httptest.Server, tenant string, body string, every time.Duration, stop chan struct{}) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: orderservice\r\nAuthorization: Bearer %s\r\nX-Test-Tenant: %s\r\n"+
		"Content-Type: application/json\r\nIdempotency-Key: slow\r\nContent-Length: %d\r\n\r\n", fairKeys[tenant], tenant, len(body))
	go func() {
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	return conn
}

// A body that stalls past BodyTimeout is answered 408 request_timeout,
// its connection closed; the request reaches nothing behind the Guard.
func TestABodyThatStallsIsAnswered408(t *testing.T) {
	var reached atomic.Int64
	s := &httpapi.Server{Tenants: httpapi.NewTenants(fairKeys), Admission: httpapi.NewAdmission(1, 0, time.Second, nil),
		BodyTimeout: 300 * time.Millisecond}
	srv := httptest.NewServer(s.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusOK)
	})))
	t.Cleanup(srv.Close)
	stop := make(chan struct{})
	defer close(stop)
	conn := trickle(t, srv, "acme", `{"customer_id":"cus_1"}`, time.Hour, stop) // one header block, then nothing
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))                  // the test's own bound, far beyond the 300ms
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	var p struct{ Code string }
	if res.StatusCode != http.StatusRequestTimeout || json.Unmarshal(body, &p) != nil || p.Code != "request_timeout" || !res.Close {
		t.Errorf("a stalled body = %d %s (close %v), want 408 request_timeout and the connection closed", res.StatusCode, body, res.Close)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d requests reached the router, want none", n)
	}
}

// A slow sender holds nothing: while twenty connections of acme trickle
// a create's body, a byte every 100ms, against two slots, every request
// of globex is answered, and acme's slow bodies are served once whole.
func TestSlowBodiesTakeNoSlot(t *testing.T) {
	var served sync.Map // tenant -> *atomic.Int64
	s := &httpapi.Server{Tenants: httpapi.NewTenants(fairKeys), Admission: httpapi.NewAdmission(2, 100, time.Second, nil),
		BodyTimeout: time.Minute}
	srv := httptest.NewServer(s.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := served.LoadOrStore(r.Header.Get("X-Test-Tenant"), &atomic.Int64{})
		n.(*atomic.Int64).Add(1)
		w.WriteHeader(http.StatusOK)
	})))
	t.Cleanup(srv.Close)
	stop := make(chan struct{})
	defer close(stop)
	const slow = 20
	body := `{"customer_id":"cus_slow"}`
	var conns []net.Conn
	for range slow {
		conns = append(conns, trickle(t, srv, "acme", body, 100*time.Millisecond, stop))
	}
	time.Sleep(300 * time.Millisecond) // every slow one is inside, its body coming
	for i := range 20 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+fairKeys["globex"])
		req.Header.Set("X-Test-Tenant", "globex")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("globex's request %d while %d bodies trickled = %d, want 200", i, slow, res.StatusCode)
		}
	}
	ok := 0
	for _, conn := range conns {
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // the test's own bound
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil && res.StatusCode == http.StatusOK {
			ok++
		}
	}
	if ok != slow {
		t.Errorf("%d of the %d slow bodies were served once whole, want all", ok, slow)
	}
}
