package steps

import (
	"context"
	"encoding/json"
	"os"
	"sync"
)

// Line is one recorded step as a trace file holds it: one JSON object a
// line, its step's kind in "step", its sequence number in "seq".
type Line struct {
	Seq  int             `json:"seq"`
	Step string          `json:"step"`
	Data json.RawMessage `json:"data"`
}

// Log keeps a run's steps in memory, in the order they were told, and
// writes those that stand to a file as lines (Write): a step told inside a
// transaction's attempt keeps its place, and is written only if that
// attempt committed (Attempt).
type Log struct {
	mu    sync.Mutex
	steps []told
}

// told is one step as it was told: its kind, its event, and the attempt
// of a transaction it was told in (nil: none).
type told struct {
	step string
	data json.RawMessage
	in   *attempt
}

// Record implements Recorder.
func (l *Log) Record(ctx context.Context, ev Event) {
	data, err := json.Marshal(ev)
	if err != nil {
		panic(err) // the events are plain structs: this is a bug
	}
	in := attemptOf(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, told{step: ev.Step(), data: data, in: in})
}

// Lines are the steps that stand, in the order they were told, numbered
// from 0: a step of a transaction that rolled back (or has not committed
// yet) is left out.
func (l *Log) Lines() []Line {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []Line
	for _, s := range l.steps {
		if s.in.stands() {
			lines = append(lines, Line{Seq: len(lines), Step: s.step, Data: s.data})
		}
	}
	return lines
}

// Write writes the steps that stand (Lines) to path, one JSON line each.
func (l *Log) Write(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, line := range l.Lines() {
		if err := enc.Encode(line); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
