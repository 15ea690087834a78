//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// faultProxy is a Toxiproxy TCP proxy run inside the test process: the
// service dials Addr instead of the real upstream, and toxics added here
// degrade that traffic.
type faultProxy struct {
	proxy *toxiproxy.Proxy
	// Addr is where the proxy listens (127.0.0.1:port).
	Addr string
}

// newProxyServer is the in-process Toxiproxy that owns the proxies; no
// HTTP API is started, the test adds toxics directly.
func newProxyServer() *toxiproxy.ApiServer {
	return toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
}

// newFaultProxy starts a proxy to upstream (host:port) on a free loopback
// port, stopped when the test ends.
func newFaultProxy(t *testing.T, srv *toxiproxy.ApiServer, name, upstream string) *faultProxy {
	t.Helper()
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start fault proxy %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{proxy: p, Addr: p.Listen}
}

// toxic is one Toxiproxy toxic: Type is latency, reset_peer, timeout,
// limit_data, slicer …; Stream is "upstream" (towards the server) or
// "downstream" (answers); Toxicity is the share of connections it hits.
type toxic struct {
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]any `json:"attributes"`
}

func (x toxic) String() string {
	attrs, _ := json.Marshal(x.Attributes)
	return fmt.Sprintf("%s/%s@%.0f%%%s", x.Type, x.Stream, x.Toxicity*100, attrs)
}

// add puts the toxics on the proxy; existing connections get them too.
func (f *faultProxy) add(t *testing.T, toxics ...toxic) {
	t.Helper()
	for i, x := range toxics {
		body, err := json.Marshal(struct {
			toxic
			Name string `json:"name"`
		}{x, fmt.Sprintf("%s_%s_%d", x.Type, x.Stream, i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
			t.Fatalf("add toxic %s to %s: %v", x, f.proxy.Name, err)
		}
	}
}

// clear removes every toxic: the proxy passes traffic unchanged again.
func (f *faultProxy) clear() { f.proxy.Toxics.ResetToxics(context.Background()) }
