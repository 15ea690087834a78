package main

import (
	"sync"

	"github.com/orderservice/orderservice/lab/lessons"
)

// Events only the lab emits, next to the lessons' own kinds.
const (
	// kindWaiting: in step mode, Request is ready and waits for "next".
	kindWaiting lessons.Kind = "waiting"
	// kindState: Text is "running" or "idle", OK whether stepping.
	kindState lessons.Kind = "state"
)

// hub fans the session's events out to every open page, and keeps those
// since the last lesson started so a page opened (or reloaded) mid-lesson
// draws the whole timeline.
type hub struct {
	mu      sync.Mutex
	history []lessons.Event
	subs    map[chan lessons.Event]struct{}
}

func newHub() *hub { return &hub{subs: map[chan lessons.Event]struct{}{}} }

// publish sends e to every subscriber. One that cannot keep up is dropped
// (its channel closed): its page reconnects and gets the history again.
func (h *hub) publish(e lessons.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Kind == lessons.KindLessonStart {
		h.history = h.history[:0]
	}
	if e.Kind != kindState {
		h.history = append(h.history, e)
	}
	for ch := range h.subs {
		select {
		case ch <- e:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// subscribe returns the events so far and a channel of those to come;
// cancel ends the subscription.
func (h *hub) subscribe() (history []lessons.Event, events <-chan lessons.Event, cancel func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan lessons.Event, 1024)
	h.subs[ch] = struct{}{}
	history = append([]lessons.Event(nil), h.history...)
	return history, ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	}
}
