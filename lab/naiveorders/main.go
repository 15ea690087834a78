// Command naiveorders serves a DELIBERATELY WRONG order service. DO NOT
// COPY IT: it is package naive (./naive), built to show the common mistakes
// of request idempotency failing, one switch each. The pitfall lessons of
// `make demo` and `make lab` run it for you next to the real service; this
// command serves it on its own, against the real mock payment channel, for
// a learner with curl. With `make run` going:
//
//	go run ./lab/naiveorders -mistake check-then-insert
//	ORDER='{"customer_id":"cus_1","currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unit_price":1250}]}'
//	curl -s -X POST 'localhost:8099/admin/hold?n=5'   # the race made certain
//	seq 5 | xargs -P5 -I{} curl -s localhost:8099/v1/orders -H 'Idempotency-Key: R1' -d "$ORDER"
//	curl -s 'localhost:8099/v1/orders?customer_id=cus_1'   # five orders for one intent
//
// docs/lab.md ("Pitfalls") has the same as one paste, with fresh keys.
// -mistake takes a comma-separated list (none: the minimal correct
// version); docs/lab.md tells what each one breaks. Its data is in
// PostgreSQL, in a schema named after its mistakes
// (naive_check_then_insert, …); POST /admin/hold?n=5 holds the window of
// check-then-insert open until five requests are in it, POST
// /admin/advance?by=48h moves its clock on and POST /admin/cleanup applies
// its retention, for the mistakes that need time to pass.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/lab/naiveorders/naive"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "naiveorders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("naiveorders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	orEnv := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	listen := fs.String("listen", orEnv("NAIVE_ADDR", "localhost:8099"), "address to serve on (env NAIVE_ADDR)")
	mistakes := fs.String("mistake", "", "comma-separated mistakes to make: "+strings.Join(naive.Names(), ", "))
	dbURL := fs.String("database", orEnv("NAIVE_DATABASE_URL", "postgres://postgres:postgres@localhost:5432/naiveorders?sslmode=disable"),
		"PostgreSQL for its orders and records, the database created if missing (env NAIVE_DATABASE_URL)")
	channelURL := fs.String("channel", orEnv("NAIVE_CHANNEL_URL", "http://127.0.0.1:8081"),
		"the mock payment channel, `make run` embeds one here (env NAIVE_CHANNEL_URL)")
	ttl := fs.Duration("cache-ttl", naive.DefaultCacheTTL, "the TTL of the expiring-cache mistake")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, err := naive.Parse(*mistakes)
	if err != nil {
		return err
	}
	db, err := database.Open(ctx, *dbURL, database.Options{MaxConns: 10, StatementTimeout: 10 * time.Second,
		LockTimeout: 10 * time.Second, ApplicationName: "naiveorders"})
	if err != nil {
		return err
	}
	defer database.Close(db)
	svc, err := naive.New(ctx, naive.Config{DB: db, ChannelURL: *channelURL, Mistakes: m, CacheTTL: *ttl})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "naiveorders: DELIBERATELY WRONG, making the mistakes: %s; on http://%s, tables in schema %s, channel %s\n",
		m, ln.Addr(), svc.Schema(), *channelURL)
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
