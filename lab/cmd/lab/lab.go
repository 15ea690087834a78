package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/orderservice/orderservice/lab/lessons"
)

// errBusy: a lesson is already running; the lab plays one at a time, as
// its timeline shows one.
var errBusy = errors.New("a lesson is running; wait for it or let its steps go")

// errNotWaiting: "next" was asked while no request waits for it.
var errNotWaiting = errors.New("no request is waiting for a step")

// lab is the state behind the page: one session against the service, the
// lesson running in it (if any) and, in step mode, the request waiting.
type lab struct {
	ctx     context.Context // the lab's lifetime: lessons run under it, not under a page's request
	session *lessons.Session
	hub     *hub

	mu       sync.Mutex
	running  bool
	stepping bool
	waiting  int           // requests held for a step
	next     chan struct{} // a step lets one waiting request go
	results  map[int]bool  // lesson -> passed, for the list's marks
}

func newLab(ctx context.Context, cfg lessons.Config) *lab {
	l := &lab{ctx: ctx, hub: newHub(), next: make(chan struct{}), results: map[int]bool{}}
	l.session = lessons.NewSession(cfg, l.hub.publish)
	return l
}

// play starts lessons (one, or all in order) in the background.
func (l *lab) play(list []lessons.Lesson, step bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		return errBusy
	}
	l.running, l.stepping = true, step
	l.hub.publish(lessons.Event{Kind: kindState, Text: "running", OK: step})
	// Only a stepped run holds requests for a step, and only it may say
	// that a step let one go at once: a run with Run passes no step at all.
	var stepFn lessons.StepFunc
	if step {
		stepFn = l.waitForStep
	}
	go func() {
		for _, ls := range list {
			out := l.session.Play(l.ctx, ls, stepFn)
			l.mu.Lock()
			l.results[ls.Number] = out.Passed
			l.mu.Unlock()
			if l.ctx.Err() != nil {
				break
			}
		}
		l.mu.Lock()
		l.running, l.stepping = false, false
		l.mu.Unlock()
		l.hub.publish(lessons.Event{Kind: kindState, Text: "idle"})
	}()
	return nil
}

// waitForStep holds a lesson's request until the learner lets it go, when
// they are stepping; otherwise it returns at once.
func (l *lab) waitForStep(ctx context.Context, r lessons.Request) error {
	l.mu.Lock()
	stepping := l.stepping
	if stepping {
		l.waiting++
	}
	l.mu.Unlock()
	if !stepping {
		return nil
	}
	defer func() {
		l.mu.Lock()
		l.waiting--
		l.mu.Unlock()
	}()
	l.hub.publish(lessons.Event{Kind: kindWaiting, Request: &r, At: time.Now()})
	select {
	case <-l.next:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// step lets the waiting request go; with all, the rest of the lesson runs
// without stopping.
func (l *lab) step(all bool) error {
	l.mu.Lock()
	if all {
		l.stepping = false
	}
	waiting := l.waiting
	l.mu.Unlock()
	if waiting == 0 {
		if all {
			return nil
		}
		return errNotWaiting
	}
	select {
	case l.next <- struct{}{}:
		return nil
	case <-time.After(2 * time.Second):
		return errNotWaiting
	}
}

// resultsSoFar are the lessons played, and whether each passed.
func (l *lab) resultsSoFar() map[int]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int]bool, len(l.results))
	for k, v := range l.results {
		out[k] = v
	}
	return out
}
