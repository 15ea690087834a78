// Command paymentchannel serves the mock payment channel over HTTP, its
// ledger kept in its own PostgreSQL database (CHANNEL_DATABASE_URL), its
// webhooks delivered to CHANNEL_WEBHOOK_URL.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/tracing"
)

// shutdownTimeout bounds how long in-flight requests get to finish.
const shutdownTimeout = 10 * time.Second

func main() {
	if err := run(context.Background(), os.Args, environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "paymentchannel: %v\n", err)
		os.Exit(1)
	}
}

func environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// run serves the channel until ctx ends or SIGINT/SIGTERM arrives.
func run(ctx context.Context, args []string, environ map[string]string, stdout, _ io.Writer) error {
	if len(args) > 1 {
		return fmt.Errorf("unexpected arguments %q: configure with HTTP_ADDR, PAYMENT_SLOW_DELAY, LOG_LEVEL, CHANNEL_DATABASE_URL, "+
			"PAYMENT_ASYNC_DELAY, CHANNEL_WEBHOOK_URL, CHANNEL_WEBHOOK_RETRY_WINDOW, PAYMENT_WEBHOOK_SECRET, CHANNEL_KEY_WINDOW", args[1:])
	}
	cfg, err := mockchannel.LoadConfig(environ)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.Level()}))
	// Traces, when the OTEL_* variables turn them on: its spans join the
	// order service's through the traceparent each request carries.
	stopTracing, err := tracing.Start(ctx, environ, "paymentchannel")
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(ctx)
	}()

	// Listen before serving so that a bind error stops the start, not a goroutine.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR=%s: %w; check that no other process listens there, or set HTTP_ADDR to a free address", cfg.Addr, err)
	}
	defer ln.Close() // a no-op once Serve has closed it
	ch, err := mockchannel.Open(ctx, cfg.DatabaseURL, cfg.Options(log))
	if err != nil {
		return fmt.Errorf("CHANNEL_DATABASE_URL: %w; check that PostgreSQL runs there and lets its user in, or set CHANNEL_DATABASE_URL", err)
	}
	defer ch.Close()
	srv := &http.Server{
		Handler:           ch.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("payment channel listening", "addr", ln.Addr().String(), "slow_delay", cfg.SlowDelay.String(),
		"async_delay", cfg.AsyncDelay.String(), "webhook_url", cfg.WebhookURL)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	log.Info("stopped")
	return nil
}
