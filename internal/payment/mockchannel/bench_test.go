package mockchannel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// BenchmarkCharge measures the durable channel over HTTP: a charge that
// writes the ledger, and a duplicate answered from it.
func BenchmarkCharge(b *testing.B) {
	body, _ := json.Marshal(ok(100))
	for _, kind := range []string{"fresh", "replay"} {
		b.Run(kind, func(b *testing.B) {
			srv, err := mockchannel.Open(context.Background(), channelDB, mockchannel.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			srv.Reset()
			ts := httptest.NewServer(srv.Handler())
			defer ts.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			var n atomic.Int64
			b.SetParallelism(32) // 64 callers on 2 CPUs, as the benchmark's pay scenario has
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := "same-key"
					if kind == "fresh" {
						key = fmt.Sprintf("k-%d", n.Add(1))
					}
					req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/charges", bytes.NewReader(body))
					req.Header.Set("Idempotency-Key", key)
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != http.StatusCreated {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
		})
	}
}
