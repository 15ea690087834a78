// Command orderservice serves the order API. With no PAYMENT_CHANNEL_URL it
// also runs the mock payment channel in-process, so `make run` needs nothing
// but PostgreSQL.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/orderservice/orderservice/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, os.Args[1:], environ(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orderservice:", err)
		os.Exit(1)
	}
}

func environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}
