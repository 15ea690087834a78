// Command demo narrates the lessons of request idempotency against a running
// order service: each lesson is a numbered scenario that says what it sends,
// shows what comes back, explains why, and checks it.
//
//	make run    # in one terminal: the service, its embedded payment channel and NATS
//	make demo   # in another
//
// It uses fresh idempotency keys on every run (prefixed with a run id), so it
// can run again and again against the same database. It exits with status 1
// when any scenario's check fails, naming the scenarios that failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/orderservice/orderservice/lab/lessons"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// config is what the demo needs to know: the system it talks to, and how
// to print.
type config struct {
	lessons.Config
	color bool
	only  map[int]bool // scenario numbers to run; empty runs all
}

// run parses the flags, checks that the service and the channel answer, and
// plays the scenarios.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	t := &terminal{out: stdout, color: cfg.color}
	s := lessons.NewSession(cfg.Config, t.event)
	defer s.Close()
	if err := s.Preflight(ctx); err != nil {
		return err
	}
	return t.play(ctx, s, cfg, lessons.All())
}

func parseConfig(args []string, getenv func(string) string, stdout, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	orDefault := func(env, def string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	var cfg config
	var color, only string
	cfg.RegisterFlags(fs, "DEMO_", getenv)
	fs.StringVar(&color, "color", orDefault("DEMO_COLOR", "auto"), "auto (when stdout is a terminal and NO_COLOR is unset), always or never")
	fs.StringVar(&only, "only", "", "comma-separated scenario numbers or ranges to run, e.g. 4,7 or 16-21 for the pitfalls (default all)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	switch color {
	case "auto":
		cfg.color = getenv("NO_COLOR") == "" && isTerminal(stdout)
	case "always":
		cfg.color = true
	case "never":
		cfg.color = false
	default:
		return config{}, fmt.Errorf("-color must be auto, always or never, not %q", color)
	}

	if only != "" {
		cfg.only = map[int]bool{}
		for f := range strings.SplitSeq(only, ",") {
			from, to, isRange := strings.Cut(strings.TrimSpace(f), "-")
			if !isRange {
				to = from
			}
			a, errA := strconv.Atoi(from)
			b, errB := strconv.Atoi(to)
			if errA != nil || errB != nil || a < 1 || b < a {
				return config{}, errors.New("-only takes scenario numbers and ranges, e.g. -only 4,7 or -only 16-21")
			}
			for n := a; n <= b; n++ {
				cfg.only[n] = true
			}
		}
	}
	return cfg, nil
}

// isTerminal reports whether w is a terminal (a character device), where
// colour helps; in a pipe or a file it would be noise.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
