// Command healthcheck is the container health probe: the runtime image is
// distroless (no shell, curl or wget), so compose runs this instead. It GETs
// the URL in its first argument and exits 0 on a 2xx answer, 1 otherwise.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// defaultURL is the order service's liveness endpoint inside its container.
const defaultURL = "http://127.0.0.1:8080/healthz"

// timeout bounds the whole probe; compose's own timeout is longer.
const timeout = 2 * time.Second

func main() {
	if err := run(context.Background(), os.Args, http.DefaultTransport); err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

// run probes args[1] (or defaultURL) once.
func run(ctx context.Context, args []string, transport http.RoundTripper) error {
	url := defaultURL
	switch len(args) {
	case 0, 1:
	case 2:
		url = args[1]
	default:
		return fmt.Errorf("usage: healthcheck [URL], got %d arguments", len(args)-1)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
