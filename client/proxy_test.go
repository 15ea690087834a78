package client_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// faultProxy sits between a client and the service and loses answers: it
// forwards each request, reads the service's whole answer, and for the first
// request it sees under each Idempotency-Key closes the client's connection
// instead of answering. The service acted; the client never hears of it,
// which is the lost response of the seed's O9 story.
type faultProxy struct {
	t        testing.TB
	ln       net.Listener
	target   string
	forward  *http.Client
	maxDrops int // 0: drop the first answer of every key

	mu      sync.Mutex
	perKey  map[string]int // requests seen under each key
	order   []string       // keys in arrival order, one entry per request
	dropped int
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// startFaultProxy proxies to target (e.g. "http://127.0.0.1:1234"), losing
// at most maxDrops answers in all (0: no limit).
func startFaultProxy(t testing.TB, target string, maxDrops int) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fault proxy: %v", err)
	}
	p := &faultProxy{t: t, ln: ln, target: target, maxDrops: maxDrops,
		forward: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		perKey:  map[string]int{}, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's base URL.
func (p *faultProxy) URL() string { return "http://" + p.ln.Addr().String() }

// Requests returns how many requests carried key.
func (p *faultProxy) Requests(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.perKey[key]
}

// Keys returns the key of every request seen, in arrival order.
func (p *faultProxy) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order...)
}

// Dropped returns how many answers were lost.
func (p *faultProxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[conn] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(conn)
			p.mu.Lock()
			delete(p.conns, conn)
			p.mu.Unlock()
			conn.Close()
		}()
	}
}

// serve handles one client connection, request after request (keep-alive),
// until a lost answer or an error closes it.
func (p *faultProxy) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return
		}
		key := req.Header.Get("Idempotency-Key")
		drop := p.arrived(key)

		out, err := http.NewRequest(req.Method, p.target+req.RequestURI, bytes.NewReader(body))
		if err != nil {
			p.t.Errorf("fault proxy: %v", err)
			return
		}
		out.Header = req.Header.Clone()
		resp, err := p.forward.Do(out)
		if err != nil {
			p.t.Errorf("fault proxy: forwarding %s %s: %v", req.Method, req.RequestURI, err)
			return
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			p.t.Errorf("fault proxy: reading the answer to %s %s: %v", req.Method, req.RequestURI, err)
			return
		}
		if drop {
			return // the service has answered; the client never hears it
		}
		resp.Body = io.NopCloser(bytes.NewReader(answer))
		resp.ContentLength = int64(len(answer))
		resp.TransferEncoding = nil
		if err := resp.Write(conn); err != nil {
			return
		}
	}
}

// arrived counts a request and says whether its answer is to be lost: the
// first one under each key, while drops remain.
func (p *faultProxy) arrived(key string) (drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.order = append(p.order, key)
	p.perKey[key]++
	if key == "" || p.perKey[key] > 1 || (p.maxDrops > 0 && p.dropped >= p.maxDrops) {
		return false
	}
	p.dropped++
	return true
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.forward.CloseIdleConnections()
}
