// Command paymentchannel serves the mock payment channel over HTTP.
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
	"syscall"
	"time"

	"github.com/orderservice/orderservice/internal/payment/channel"
)

// shutdownTimeout bounds how long in-flight requests get to finish.
const shutdownTimeout = 10 * time.Second

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "paymentchannel: %v\n", err)
		os.Exit(1)
	}
}

// config is everything the process reads from its environment.
type config struct {
	addr      string
	slowDelay time.Duration
	logLevel  slog.Level
}

func parseConfig(getenv func(string) string) (config, error) {
	cfg := config{addr: ":8081", slowDelay: channel.DefaultSlowDelay, logLevel: slog.LevelInfo}
	if v := getenv("HTTP_ADDR"); v != "" {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return config{}, fmt.Errorf("HTTP_ADDR %q is not host:port: %w", v, err)
		}
		cfg.addr = v
	}
	if v := getenv("PAYMENT_SLOW_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return config{}, fmt.Errorf("PAYMENT_SLOW_DELAY %q must be a positive Go duration such as 2s", v)
		}
		cfg.slowDelay = d
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		levels := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
		level, ok := levels[v]
		if !ok {
			return config{}, fmt.Errorf("LOG_LEVEL %q must be debug, info, warn or error", v)
		}
		cfg.logLevel = level
	}
	return cfg, nil
}

// run serves the channel until ctx ends or SIGINT/SIGTERM arrives.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 1 {
		return fmt.Errorf("unexpected arguments %q: configure with HTTP_ADDR, PAYMENT_SLOW_DELAY, LOG_LEVEL", args[1:])
	}
	cfg, err := parseConfig(getenv)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.logLevel}))

	// Listen before serving so that a bind error stops the start, not a goroutine.
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.addr, err)
	}
	srv := &http.Server{
		Handler:           channel.New(channel.Options{SlowDelay: cfg.slowDelay, Logger: log}).Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("payment channel listening", "addr", ln.Addr().String(), "slow_delay", cfg.slowDelay.String())

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
