// Command lab serves a web page where a learner runs each lesson of request
// idempotency against a running order service and watches it happen: a
// swimlane timeline of the requests, the idempotency record, the order and
// the payment channel, the lesson's checks and its "why", fault toggles at
// the channel, and re-sends of any request with the same key or a new one.
//
//	make run    # in one terminal: the service, its embedded payment channel and NATS
//	make lab    # in another, then open http://localhost:8090
//
// The lessons are the ones `make demo` narrates (lab/lessons); the lab
// talks to the service only through its public API, to the channel through
// its admin API and to the broker as the tenant's NATS user (the operator's
// for a DLQ replay), as any client would. The pitfall lessons also run a
// deliberately naive order service (lab/naiveorders) in this process,
// against the same channel, its tables in -naive-database.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/lab/lessons"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

// config is what the lab needs: where it listens and what it talks to.
type config struct {
	lessons.Config
	listen string
}

// run parses the flags, listens, and serves until ctx is cancelled.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	srv, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab: open http://%s (service %s, channel %s)\n", browsable(srv.addr), cfg.BaseURL, cfg.ChannelURL)
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.close(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{Config: lessons.Config{Observe: true}}
	cfg.RegisterFlags(fs, "LAB_", getenv)
	listen := getenv("LAB_ADDR")
	if listen == "" {
		listen = "localhost:8090"
	}
	fs.StringVar(&cfg.listen, "listen", listen, "address the lab serves on (env LAB_ADDR)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	cfg.ChannelURL = strings.TrimRight(cfg.ChannelURL, "/")
	return cfg, nil
}

// browsable turns a listen address into one a browser can open: ":8090"
// and "0.0.0.0:8090" become localhost.
func browsable(addr string) string {
	for _, any := range []string{"0.0.0.0:", "[::]:"} {
		if strings.HasPrefix(addr, any) {
			return "localhost:" + strings.TrimPrefix(addr, any)
		}
	}
	if strings.HasPrefix(addr, ":") {
		return "localhost" + addr
	}
	return addr
}
