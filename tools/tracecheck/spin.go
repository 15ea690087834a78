package main

// The search: the model compiled once with -DTRACE for each configuration
// the traces are checked against (-DORDER, -DREFUND), each verifier in a
// directory of its own; each run of a verifier reads one trace
// (TRACE_FILE), or its first events (TRACE_LEN), and searches for a path
// that takes every event in turn.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

type result struct {
	explained bool
	first     int // the first event no path explains
	err       error
}

// spin runs the searches, remembering the verdict on each distinct trace
// (many runs make the same trace).
type spin struct {
	dir   string // where pan is
	mu    sync.Mutex
	cache map[string]bool
	runs  int
}

// verifiers are the model's verifiers, one for each configuration.
type verifiers map[config]*spin

// compileAll builds the verifier of model in each configuration of cfgs,
// side by side.
func compileAll(model []byte, cfgs []config) (verifiers, error) {
	v := verifiers{}
	errs := make([]error, len(cfgs))
	spins := make([]*spin, len(cfgs))
	var wg sync.WaitGroup
	for i, c := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spins[i], errs[i] = compile(model, c)
		}()
	}
	wg.Wait()
	for i, c := range cfgs {
		if spins[i] != nil {
			v[c] = spins[i]
		}
	}
	if err := errors.Join(errs...); err != nil {
		v.close()
		return nil, err
	}
	return v, nil
}

// check searches t with the verifier of its configuration.
func (v verifiers) check(t *trace) result { return v[t.config].check(t) }

func (v verifiers) close() {
	for _, s := range v {
		s.close()
	}
}

// searches counts the searches of each verifier.
func (v verifiers) searches() map[config]int {
	n := map[config]int{}
	for c, s := range v {
		n[c] = s.searches()
	}
	return n
}

// compile builds the verifier of model in configuration cfg, in a
// directory of its own.
func compile(model []byte, cfg config) (*spin, error) {
	dir, err := os.MkdirTemp("", "tracecheck-"+cfg.String()+"-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "idempotency.pml"), model, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for _, c := range [][]string{
		{"spin", "-a", "-DTRACE", cfg.define(), "idempotency.pml"},
		{"cc", "-O2", "-w", "-DSAFETY", "-DNOCLAIM", "-DMEMLIM=1024", "-o", "pan", "pan.c"},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	return &spin{dir: dir, cache: map[string]bool{}}, nil
}

func (s *spin) close() { os.RemoveAll(s.dir) }

func (s *spin) searches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs
}

// check searches t, then, if the whole trace is not explained, bisects for
// the longest explained prefix: the event after it is the first that no
// path explains.
func (s *spin) check(t *trace) result {
	ok, err := s.explains(t.free, t.events)
	if err != nil || ok {
		return result{explained: ok, err: err}
	}
	lo, hi := 0, len(t.events) // prefix lo is explained, prefix hi is not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := s.explains(t.free, t.events[:mid])
		if err != nil {
			return result{err: err}
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return result{first: hi - 1}
}

// explains reports whether some path of the model takes every event in
// turn: SPIN reports the process "explained" reaching its assertion.
func (s *spin) explains(free int, events []event) (bool, error) {
	text := traceText(free, events)
	sum := sha256.Sum256([]byte(text))
	id := hex.EncodeToString(sum[:8])
	s.mu.Lock()
	if v, ok := s.cache[id]; ok {
		s.mu.Unlock()
		return v, nil
	}
	s.runs++
	file := filepath.Join(s.dir, fmt.Sprintf("%s-%d.trace", id, s.runs))
	s.mu.Unlock()
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		return false, err
	}
	defer os.Remove(file)
	// -E: a path that ends blocked is only a path that explains nothing;
	// -n: no report of unreached code. Each search has its own trail name.
	cmd := exec.Command("./pan", "-E", "-n", "-m100000")
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "TRACE_FILE="+file, "TRACE_LEN="+strconv.Itoa(len(events)))
	out, _ := cmd.CombinedOutput()
	os.Remove(filepath.Join(s.dir, "idempotency.pml.trail"))
	text = string(out)
	if !strings.Contains(text, "errors:") {
		return false, fmt.Errorf("pan did not finish:\n%s", text)
	}
	if strings.Contains(text, "max search depth too small") {
		return false, fmt.Errorf("pan: search depth too small")
	}
	ok := strings.Contains(text, "assertion violated (ti!=nev)")
	s.mu.Lock()
	s.cache[id] = ok
	s.mu.Unlock()
	return ok, nil
}

// traceText is the trace as the verifier reads it: six numbers an event,
// after a line naming the channel's steps the run did not record, if any.
func traceText(free int, events []event) string {
	var b strings.Builder
	if free != 0 {
		fmt.Fprintf(&b, "%d %d 0 0 0 0\n", eFree, free)
	}
	for _, e := range events {
		fmt.Fprintf(&b, "%d %d %d %d %d %d\n", e.kind, e.args[0], e.args[1], e.args[2], e.args[3], e.args[4])
	}
	return b.String()
}
