package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/orderservice/orderservice/client"
)

// scenario is one lesson of the seed, played against the live service.
type scenario struct {
	// title says what the scenario shows, in one line.
	title string
	// lesson says why, in one or two plain sentences tied to the seed.
	lesson string
	// run sends the requests, narrates them and checks the outcome with
	// d.check; an error means it could not go on (e.g. a transport failure).
	run func(ctx context.Context, d *demo) error
}

// demo is the state of one run: the clients, the output and the results.
type demo struct {
	cfg   config
	out   io.Writer
	runID string

	// api is the Go client the way an application would use it: it makes
	// one key per intent and retries under it.
	api *client.Client
	// once is the same client with retries off, to show single answers.
	once *client.Client
	// http sends the raw requests whose headers the demo shows.
	http *http.Client

	// metricsAtStart is scraped before the first scenario, for scenario 10.
	metricsAtStart metricSnapshot

	// ran holds the numbers of the scenarios played so far.
	ran map[int]bool
	// Per scenario: its number and the checks it made.
	num    int
	checks []checkResult
}

type checkResult struct {
	ok   bool
	what string
}

func newDemo(cfg config, out io.Writer) *demo {
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	return &demo{
		cfg:   cfg,
		out:   out,
		runID: "demo-" + hex.EncodeToString(id),
		api:   client.New(cfg.baseURL, cfg.apiKey),
		once:  client.New(cfg.baseURL, cfg.apiKey, client.WithRetry(client.RetryPolicy{MaxAttempts: 1})),
		http:  &http.Client{Timeout: 30 * time.Second},
		ran:   map[int]bool{},
	}
}

// preflight fails early, with a hint, when the service or the channel does
// not answer, and takes the first metrics snapshot.
func (d *demo) preflight(ctx context.Context) error {
	if _, err := d.get(ctx, d.cfg.baseURL+"/healthz", false); err != nil {
		return fmt.Errorf("the order service does not answer at %s (start it with `make run`, or pass -url): %w", d.cfg.baseURL, err)
	}
	if _, err := d.channelStats(ctx); err != nil {
		return fmt.Errorf("the payment channel's admin API does not answer at %s (pass -channel): %w", d.cfg.channelURL, err)
	}
	if _, err := d.api.ListOrders(ctx, client.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("the service refuses the API key (pass -api-key): %w", err)
	}
	var err error
	d.metricsAtStart, err = d.scrapeMetrics(ctx)
	return err
}

// play runs every selected scenario in order and sums up. It returns an
// error naming the scenarios whose checks failed.
func (d *demo) play(ctx context.Context, list []scenario) error {
	d.printf("%s\n", d.paint(bold, "Request idempotency, lesson by lesson"))
	d.printf("service %s · channel %s · run id %s (every key below starts with it)\n", d.cfg.baseURL, d.cfg.channelURL, d.runID)

	var passed, failed []string
	for i, s := range list {
		d.num, d.checks = i+1, nil
		if len(d.cfg.only) > 0 && !d.cfg.only[d.num] {
			continue
		}
		d.ran[d.num] = true
		name := fmt.Sprintf("%d. %s", d.num, s.title)
		d.printf("\n%s\n", d.paint(bold+cyan, name))
		err := s.run(ctx, d)
		d.printf("   %s %s\n", d.paint(bold, "why:"), wrap(s.lesson, 76, "        "))
		for _, c := range d.checks {
			d.printf("   %s %s\n", d.mark(c.ok), c.what)
		}
		if err != nil {
			d.printf("   %s could not finish: %v\n", d.mark(false), err)
		}
		if err == nil && len(d.checks) > 0 && allOK(d.checks) {
			passed = append(passed, name)
		} else {
			failed = append(failed, name)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	d.printf("\n%s %d of %d scenarios passed\n", d.paint(bold, "Summary:"), len(passed), len(passed)+len(failed))
	for _, name := range passed {
		d.printf("   %s %s\n", d.mark(true), name)
	}
	for _, name := range failed {
		d.printf("   %s %s\n", d.mark(false), name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d scenario(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

func allOK(checks []checkResult) bool {
	for _, c := range checks {
		if !c.ok {
			return false
		}
	}
	return true
}

// check records one verified claim of the current scenario; the claims are
// printed after the scenario's "why".
func (d *demo) check(ok bool, format string, args ...any) bool {
	d.checks = append(d.checks, checkResult{ok: ok, what: fmt.Sprintf(format, args...)})
	return ok
}

// key is a fresh idempotency key of the current scenario: the run id makes
// it unique across runs, the name (R1, R2, …) matches the seed's story.
func (d *demo) key(name string) string { return fmt.Sprintf("%s-%d-%s", d.runID, d.num, name) }

// customer is a customer id of its own for the current scenario, so that
// listing its orders counts only this run's.
func (d *demo) customer() string { return fmt.Sprintf("cus_%s_%d", d.runID, d.num) }

// purchase is the create body the scenarios send: two of SKU-1 at 12.50.
func (d *demo) purchase() client.CreateOrderRequest {
	return client.CreateOrderRequest{CustomerID: d.customer(), Currency: "EUR",
		Items: []client.ItemRequest{{SKU: "SKU-1", Quantity: 2, UnitPrice: 1250}}}
}

// newOrder creates an order under a fresh key, for scenarios about what
// happens after creation.
func (d *demo) newOrder(ctx context.Context, keyName string) (client.Order, error) {
	d.send("client.CreateOrder(2 × SKU-1, WithKey(%q))", d.key(keyName))
	res, err := d.api.CreateOrder(ctx, d.purchase(), client.WithKey(d.key(keyName)))
	if err != nil {
		return client.Order{}, err
	}
	d.got("%d order %s %s", res.Status, short(res.Value.ID), res.Value.Status)
	return res.Value, nil
}

// problemOf returns the service's problem behind err, or a stand-in whose
// fields match nothing when err is not one.
func problemOf(err error) *client.ProblemError {
	var pe *client.ProblemError
	if errors.As(err, &pe) {
		return pe
	}
	return &client.ProblemError{Detail: fmt.Sprint(err)}
}

// Output.

const (
	bold  = "\x1b[1m"
	dim   = "\x1b[2m"
	red   = "\x1b[31m"
	green = "\x1b[32m"
	cyan  = "\x1b[36m"
	reset = "\x1b[0m"
)

// paint colours s when the output is a terminal; plain output stays plain.
func (d *demo) paint(style, s string) string {
	if !d.cfg.color {
		return s
	}
	return style + s + reset
}

func (d *demo) mark(ok bool) string {
	if ok {
		return d.paint(green, "✓")
	}
	return d.paint(red, "✗")
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

// send narrates a request the demo makes.
func (d *demo) send(format string, args ...any) {
	d.printf("   %s %s\n", d.paint(cyan, "→"), fmt.Sprintf(format, args...))
}

// got narrates what came back.
func (d *demo) got(format string, args ...any) {
	d.printf("   %s %s\n", d.paint(green, "←"), fmt.Sprintf(format, args...))
}

// note narrates anything else: a pause, a table, an aside.
func (d *demo) note(format string, args ...any) {
	if format == "" {
		d.printf("\n")
		return
	}
	d.printf("   %s\n", d.paint(dim, fmt.Sprintf(format, args...)))
}

// table prints rows as aligned columns, the first row as the header.
func (d *demo) table(rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for n, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if i < len(r)-1 {
				c += strings.Repeat(" ", widths[i]-len([]rune(c))+2)
			}
			b.WriteString(c)
		}
		line := strings.TrimRight(b.String(), " ")
		if n == 0 {
			line = d.paint(bold, line)
		}
		d.printf("     %s\n", line)
	}
}

// wrap breaks text into lines of at most width runes, indenting every line
// but the first.
func wrap(text string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(text) {
		if i > 0 && n+1+len([]rune(w)) > width {
			b.WriteString("\n" + indent)
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len([]rune(w))
	}
	return b.String()
}

// prefix is the first n bytes of s, or s when it is shorter.
func prefix(s string, n int) string { return s[:min(n, len(s))] }

// short abbreviates an order id (a UUIDv7, whose first digits are a clock)
// to its random tail, enough to tell two orders apart on screen.
func short(id string) string {
	if len(id) <= 8 {
		return id
	}
	return "…" + id[len(id)-8:]
}
