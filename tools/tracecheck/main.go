// Command tracecheck replays runs the Go code recorded (internal/order/steps,
// written by the order tests when ORDERSERVICE_TRACE_DIR is set) against the
// SPIN model, model/idempotency.pml. Each run is cut into one trace per
// order, checked against the model compiled with -DTRACE -DORDER (one
// order, one pay intent and its cancel), and one more per order whose
// cancel sent a refund, checked against -DTRACE -DREFUND (an order PAID,
// the cancel's refund as the intent); each trace is mapped onto the
// model's events (mapping.go), and SPIN searches the verifier of its
// configuration for a path that takes every event in turn. When none
// does, the shortest prefix that no path explains names the first event
// the model cannot explain (found by bisection), and tracecheck fails.
//
// An order's second pay key is checked too: each pay key that went on to
// the channel is a generation with a -DORDER trace of its own, from its
// new claim, and the trace before it takes that claim as one event, pay2
// (E_PAY2: on to the channel, or refused in phase 1, which is all of a
// refused key that is modelled); the cancel goes to the newest
// generation's trace. Still beyond the model, counted and not checked: an
// intent that ran before the run was recorded (a pay key, the first or a
// later one, whose new claim the run does not hold, or a refund whose
// start it does not), a second cancel key whose refund started, and a late
// verdict on a refund.
//
//	go run ./tools/tracecheck [-model model/idempotency.pml] [-jobs N] DIR|FILE...
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

func main() {
	modelPath := flag.String("model", "model/idempotency.pml", "the Promela model")
	jobs := flag.Int("jobs", 2, "verifiers run side by side")
	verbose := flag.Bool("v", false, "a line for every trace, explained or not")
	flag.Parse()
	model, err := os.ReadFile(*modelPath)
	if err != nil {
		fail(err)
	}
	files, err := traceFiles(flag.Args())
	if err != nil {
		fail(err)
	}
	if len(files) == 0 {
		fail(fmt.Errorf("no recorded runs (*.jsonl) in %v", flag.Args()))
	}
	start := time.Now()
	var traces []*trace
	events, beyond := 0, 0
	for _, f := range files {
		lines, err := readRun(f)
		if err != nil {
			fail(err)
		}
		events += len(lines)
		ts := mapRun(filepath.Base(f), lines)
		for _, t := range ts {
			if t.beyond != "" {
				beyond++
				if *verbose {
					fmt.Printf("%s: beyond the model: %s\n", t.name, t.beyond)
				}
				continue
			}
			traces = append(traces, t)
		}
	}
	// A verifier for each configuration some trace is checked against:
	// runs with no refund compile none for -DREFUND, which takes seconds.
	var cfgs []config
	for _, c := range configs {
		if slices.ContainsFunc(traces, func(t *trace) bool { return t.config == c }) {
			cfgs = append(cfgs, c)
		}
	}
	checker, err := compileAll(model, cfgs)
	if err != nil {
		fail(err)
	}
	defer checker.close()
	var wg sync.WaitGroup
	sem := make(chan struct{}, *jobs)
	for _, t := range traces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t.result = checker.check(t)
		}()
	}
	wg.Wait()
	failed := 0
	modelEvents, longest := 0, 0
	of := map[config]int{}
	sort.Slice(traces, func(i, j int) bool { return traces[i].name < traces[j].name })
	for _, t := range traces {
		modelEvents += len(t.events)
		of[t.config]++
		longest = max(longest, len(t.events))
		switch {
		case t.result.err != nil:
			failed++
			fmt.Printf("%s: %v\n", t.name, t.result.err)
		case !t.result.explained:
			failed++
			fmt.Printf("%s: NOT EXPLAINED: the model cannot explain event %d of %d: %s\n", t.name, t.result.first+1, len(t.events), t.describe(t.result.first))
			for i := max(0, t.result.first-3); i < t.result.first; i++ {
				fmt.Printf("    explained before it: %s\n", t.describe(i))
			}
		case *verbose:
			fmt.Printf("%s: explained (%d events)\n", t.name, len(t.events))
		}
	}
	searches := checker.searches()
	fmt.Printf("tracecheck: %d recorded runs, %d steps recorded; %d traces (%d of pay keys, -DORDER; %d of their cancels' refunds, -DREFUND) of %d model events (longest %d), %d explained, %d not; %d beyond the model's configurations; %d SPIN searches (%d, %d); %s\n",
		len(files), events, len(traces), of[cfgOrder], of[cfgRefund], modelEvents, longest, len(traces)-failed, failed, beyond,
		searches[cfgOrder]+searches[cfgRefund], searches[cfgOrder], searches[cfgRefund], time.Since(start).Round(100*time.Millisecond))
	if failed > 0 {
		checker.close()
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tracecheck:", err)
	os.Exit(2)
}

// traceFiles are the *.jsonl files named, or in the directories named.
func traceFiles(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		m, err := filepath.Glob(filepath.Join(a, "*.jsonl"))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	return files, nil
}

// describe names the model event i and the step it stands for.
func (t *trace) describe(i int) string {
	e := t.events[i]
	return fmt.Sprintf("%s (recorded step %d: %s)", e, e.seq, strings.TrimSpace(e.source))
}
