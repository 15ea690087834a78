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
// writes them to a file as lines (Write).
type Log struct {
	mu    sync.Mutex
	lines []Line
}

// Record implements Recorder.
func (l *Log) Record(_ context.Context, ev Event) {
	data, err := json.Marshal(ev)
	if err != nil {
		panic(err) // the events are plain structs: this is a bug
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, Line{Seq: len(l.lines), Step: ev.Step(), Data: data})
}

// Len is how many steps were recorded.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// Write writes the steps to path, one JSON line each.
func (l *Log) Write(path string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, line := range l.lines {
		if err := enc.Encode(line); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
