// Command bench measures the order service under load, in one run on one
// machine: create throughput and latency against the same SQL transaction
// run directly over pgx, the cost of the idempotency layer (the same rows
// written over pgx with and without a record), the replay path, a
// duplicate storm, pay with a slow payment channel, create latency at a
// constant rate, creates, metrics and cleanup on big tables generated in
// SQL, an overload at three times capacity, and each tenant's share beside
// a flood. `make bench` runs it and writes docs/benchmarks/.
//
// Everything but the overload runs in this process: a fresh database, the
// real service (app.Start on 127.0.0.1:0 with its embedded payment channel)
// and vegeta as the load generator. The overload's service is the
// cmd/orderservice binary in a process of its own (serviceProcess). The
// service, the load and PostgreSQL share the machine's cores; the report
// says how many there were.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/tests/testdb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the knobs of a run; -quick turns every one it does not name
// down to a smoke test's size.
type options struct {
	Out         string
	Duration    time.Duration
	Warmup      time.Duration
	Concurrency intList
	// Rounds and Slice shape scenario 2's interleaved ratio: Rounds rounds
	// of one Slice of each path.
	Rounds       int
	Slice        time.Duration
	Pool         int
	ReplayConc   int
	Storm        int
	PayConc      int
	PayPool      int
	PayLatency   time.Duration
	Rate         int
	RateDuration time.Duration
	Commands     int
	// WaitDuplicates is how many copies of one slow pay wait at once in
	// scenario 10.
	WaitDuplicates int
	// Webhooks is how many pending pays scenario 11 resolves by a webhook,
	// each delivered twice; WebhookConc is its closed loop's concurrency.
	Webhooks    int
	WebhookConc int
	BigRecords  int
	BigOrders   int

	// Backlog is how many commands one tenant queues at once in scenario
	// 13; QuietCreates how many creates another sends, one at a time,
	// alone and then behind them.
	Backlog, QuietCreates int

	OverloadFor time.Duration
	// OverloadRounds is how many slices the overload is sent in, each
	// after a slice of the closed loop that measures the capacity.
	OverloadRounds int
	// OverloadLimits are the other HTTP_MAX_IN_FLIGHT the overload is run
	// at again, besides the default: what the limit trades.
	OverloadLimits intList
	// OverloadPools are the DB_MAX_CONNS it is also run at: how many
	// backends at once the database's CPUs can serve.
	OverloadPools intList
	// TenantsFor is how long each load of scenario 14 lasts.
	TenantsFor time.Duration
	Quick      bool
	CPUProfile string
	// viaMake is true when `make bench` started the run.
	viaMake bool
	// Only, when set, names the scenarios to run (a partial report, for
	// investigating one of them); by default all run.
	Only map[int]bool
	args []string
}

// Runs reports whether scenario n is part of this run; 1 and 2 are
// measured together, so either runs both.
func (o options) Runs(n int) bool {
	if n == 1 || n == 2 {
		return len(o.Only) == 0 || o.Only[1] || o.Only[2]
	}
	return len(o.Only) == 0 || o.Only[n]
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{Concurrency: []int{1, 4, 16, 64}, OverloadLimits: []int{16, 64}, OverloadPools: []int{8}, args: args, viaMake: getenv("MAKELEVEL") != ""}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Out, "out", "docs/benchmarks", "directory for results.md and throughput.svg (empty: print only)")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured time of each closed-loop point")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "unmeasured warm-up before each measurement")
	fs.IntVar(&o.Rounds, "rounds", 7, "rounds of scenario 2's interleaved comparison (one slice of each path per round)")
	fs.DurationVar(&o.Slice, "slice", 1500*time.Millisecond, "length of one slice of scenario 2's interleaved comparison")
	fs.Var(&o.Concurrency, "c", "concurrencies of the create comparison, comma-separated")
	fs.IntVar(&o.Pool, "pool", 20, "DB_MAX_CONNS of the service, and the size of the direct pgx pool")
	fs.IntVar(&o.ReplayConc, "replay-c", 16, "concurrency of the replay-vs-first-execution comparison")
	fs.IntVar(&o.Storm, "storm", 1000, "copies of one request fired at once in the duplicate storm")
	fs.IntVar(&o.PayConc, "pay-c", 64, "concurrency of the pay scenario")
	fs.IntVar(&o.PayPool, "pay-pool", 10, "DB_MAX_CONNS of the service in the pay scenario")
	fs.DurationVar(&o.PayLatency, "pay-latency", 50*time.Millisecond, "latency the payment channel adds in the pay scenario")
	fs.IntVar(&o.Rate, "rate", 100, "requests per second of the constant-rate latency scenario")
	fs.DurationVar(&o.RateDuration, "rate-duration", 10*time.Second, "length of the constant-rate latency scenario")
	fs.IntVar(&o.Commands, "commands", 10000, "create commands sent through JetStream in scenario 9")
	fs.IntVar(&o.WaitDuplicates, "wait-duplicates", 1000, "copies of one slow pay that wait for it at once in scenario 10")
	fs.IntVar(&o.Webhooks, "webhooks", 2000, "pending pays whose webhook scenario 11 delivers, each twice")
	fs.IntVar(&o.WebhookConc, "webhook-c", 16, "concurrency of scenario 11's deliveries")
	fs.IntVar(&o.Backlog, "backlog", 50_000, "commands one tenant queues at once in scenario 13")
	fs.IntVar(&o.QuietCreates, "quiet-creates", 200, "creates another tenant sends one at a time in scenario 13, alone and behind the backlog")
	fs.IntVar(&o.BigRecords, "records", 10_000_000, "idempotency records generated for the big-table scenario")
	fs.IntVar(&o.BigOrders, "orders", 2_000_000, "orders (two items and an event each) generated for the big-table scenario")
	fs.DurationVar(&o.OverloadFor, "overload-duration", 20*time.Second, "length of the overload at three times capacity")
	fs.IntVar(&o.OverloadRounds, "overload-rounds", 4, "slices the overload is sent in, each after a slice of the capacity's closed loop")
	fs.Var(&o.OverloadLimits, "overload-limits", "HTTP_MAX_IN_FLIGHT values the overload is also run at, comma-separated")
	fs.Var(&o.OverloadPools, "overload-pools", "DB_MAX_CONNS values the overload is also run at, comma-separated")
	fs.DurationVar(&o.TenantsFor, "tenants-duration", 10*time.Second, "length of each load of scenario 14 (a quiet tenant alone, beside a flood at five times capacity, 64 closed-loop clients)")
	fs.BoolVar(&o.Quick, "quick", false, "a smoke-test run: short points, concurrencies 1 and 4, the overload at the defaults, one pool and no admission only, a storm of 50, 16 pays in flight, 20 000 records, 200 webhooks")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole run (service and load) to this file")
	var only intList
	fs.Var(&only, "only", "run only these scenarios, comma-separated (1-14; 1 and 2 run together)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, n := range only {
		if n < 1 || n > 14 {
			return o, fmt.Errorf("-only: there is no scenario %d", n)
		}
		if o.Only == nil {
			o.Only = map[int]bool{}
		}
		o.Only[n] = true
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quick := map[string]func(){
			"duration":          func() { o.Duration = 400 * time.Millisecond },
			"warmup":            func() { o.Warmup = 100 * time.Millisecond },
			"c":                 func() { o.Concurrency = []int{1, 4} },
			"rounds":            func() { o.Rounds = 2 },
			"slice":             func() { o.Slice = 200 * time.Millisecond },
			"storm":             func() { o.Storm = 50 },
			"pay-c":             func() { o.PayConc = 16 },
			"rate-duration":     func() { o.RateDuration = time.Second },
			"records":           func() { o.BigRecords = 20_000 },
			"orders":            func() { o.BigOrders = 4_000 },
			"overload-duration": func() { o.OverloadFor = time.Second },
			// The other limits are the full run's question.
			"overload-limits":  func() { o.OverloadLimits = nil },
			"overload-rounds":  func() { o.OverloadRounds = 2 },
			"tenants-duration": func() { o.TenantsFor = time.Second },
			"commands":         func() { o.Commands = 200 },
			"wait-duplicates":  func() { o.WaitDuplicates = 100 },
			"webhooks":         func() { o.Webhooks = 200 },
			"backlog":          func() { o.Backlog = 2000 },
			"quiet-creates":    func() { o.QuietCreates = 20 },
			// Smoke figures never overwrite the committed results.
			"out": func() { o.Out = filepath.Join(os.TempDir(), "orderservice-bench-quick") },
		}
		for name, apply := range quick {
			if !set[name] {
				apply()
			}
		}
	}
	switch {
	case o.Duration <= 0 || o.Warmup < 0 || o.RateDuration <= 0 || o.OverloadFor <= 0 || o.Slice <= 0 || o.TenantsFor <= 0:
		return o, errors.New("-duration, -slice, -rate-duration, -overload-duration and -tenants-duration must be positive, -warmup not negative")
	case o.Rounds < 1 || o.OverloadRounds < 1:
		return o, errors.New("-rounds and -overload-rounds must be at least 1")
	case o.BigRecords < 10 || o.BigOrders < 1:
		return o, errors.New("-records must be at least 10, -orders at least 1")
	case len(o.Concurrency) == 0:
		return o, errors.New("-c needs at least one concurrency")
	case o.Pool < 1 || o.PayPool < 1 || o.ReplayConc < 1 || o.PayConc < 1 || o.Storm < 1 || o.Rate < 1 || o.Commands < 1 || o.WaitDuplicates < 1 ||
		o.Webhooks < 1 || o.WebhookConc < 1 || o.Backlog < 1 || o.QuietCreates < 1:
		return o, errors.New("-pool, -pay-pool, -replay-c, -pay-c, -storm, -rate, -commands, -wait-duplicates, -webhooks, -webhook-c, -backlog and -quiet-creates must be at least 1")
	case o.PayLatency <= 0:
		return o, errors.New("-pay-latency must be positive")
	}
	return o, nil
}

// command is the command line that reproduces this run.
func (o options) command() string {
	cmd := "go run ./tests/bench"
	if len(o.args) > 0 {
		cmd += " " + strings.Join(o.args, " ")
	}
	cmd = "`" + cmd + "`"
	if o.viaMake {
		cmd = "`make bench`, which ran " + cmd
	}
	return cmd
}

// intList is a flag of positive integers, written comma-separated.
type intList []int

func (l intList) String() string {
	s := make([]string, len(l))
	for i, n := range l {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	if v == "" { // none: -overload-limits= runs the defaults only
		*l = nil
		return nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// run is the whole program: create a database, boot the service, measure
// every scenario, print the report and write it under -out.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, err := parseOptions(args, getenv, stderr)
	if err != nil {
		return err
	}
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	dbURL, drop, err := testdb.Create("bench")
	if err != nil {
		return err
	}
	defer drop()

	b, err := newBench(ctx, opts, dbURL, stderr)
	if err != nil {
		return err
	}
	defer b.close()

	start := time.Now()
	res, err := b.runAll(ctx)
	if err != nil {
		return err
	}
	res.Took = time.Since(start).Round(time.Second)

	report, err := render(res, "throughput.svg")
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, report)
	if opts.Out != "" {
		if err := os.MkdirAll(opts.Out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(opts.Out, "results.md"), []byte(report), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(opts.Out, "throughput.svg"), chart(res), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote %s and %s\n", filepath.Join(opts.Out, "results.md"), filepath.Join(opts.Out, "throughput.svg"))
	}
	return res.verdict()
}
