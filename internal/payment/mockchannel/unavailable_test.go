package mockchannel_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// cutProxy forwards TCP to PostgreSQL until cut, which drops every
// connection and refuses new ones, as a network partition would.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

func TestUnreachableLedger(t *testing.T) {
	t.Run("a charge while the ledger is unreachable is 503 and charges nothing; its retry charges once", func(t *testing.T) {
		direct, err := url.Parse(testdb.Fresh(t, "channel_cut"))
		if err != nil {
			t.Fatal(err)
		}
		proxy := newCutProxy(t, direct.Host)
		viaProxy := *direct
		viaProxy.Host = proxy.ln.Addr().String()
		h := openHarness(t, viaProxy.String(), mockchannel.Options{})
		expectStatus(t, h.charge("k1", ok(100)), http.StatusCreated, "")

		proxy.setCut(true)
		down := h.charge("k2", ok(200))
		expectStatus(t, down, http.StatusServiceUnavailable, "service_unavailable")
		if down.header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After = %q, want 1", down.header.Get("Retry-After"))
		}
		expectStatus(t, h.must(http.MethodGet, "/admin/stats", "", nil), http.StatusServiceUnavailable, "service_unavailable")

		proxy.setCut(false)
		expectStatus(t, h.charge("k2", ok(200)), http.StatusCreated, "")
		expectStatus(t, h.charge("k1", ok(100)), http.StatusCreated, "")
		// The POST that found the ledger unreachable could not count itself.
		expectStats(t, h.srv, mockchannel.Stats{Charges: 2, DuplicatesAbsorbed: 1, Requests: 3, AmountCharged: 300})
	})
}
