package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// A queue whose waiters all waited longer than the target for a whole
// interval stands: the tenant is overloaded, and its queue may hold no
// more than the slots it holds (one turn of them); an arrival past that is
// shed at once rather than queued. Until then, both queue. One slot,
// QueueTimeout 400ms (target 40ms, interval 80ms); each request holds the
// slot until the test lets it go.
func TestAStandingQueueIsOverloadAndABriefOneIsNot(t *testing.T) {
	handler, entered, release := heldHandler()
	send := sendTo
	// steps sends, one after another, requests that each wait behind the
	// one holding the slot for as long as it is told, then lets the holder
	// go; it returns the last one, holding the slot.
	steps := func(h http.Handler, holds ...time.Duration) chan int {
		holder := send(h)
		<-entered
		for _, hold := range holds {
			next := send(h)
			time.Sleep(hold) // next waits in the queue meanwhile
			release <- struct{}{}
			if code := <-holder; code != http.StatusOK {
				t.Fatalf("the holder = %d", code)
			}
			<-entered // next has the slot
			holder = next
		}
		return holder
	}
	// then sends two more requests while the slot is held, and lets the
	// holder go 100ms later, and each queued request after it: it returns
	// how many were answered 503 before the holder went, and how many
	// were served.
	then := func(h http.Handler, holder chan int) (shedAtOnce, served int) {
		last := []chan int{send(h), send(h)}
		time.Sleep(100 * time.Millisecond)
		var queued []chan int
		for _, answer := range last {
			select {
			case code := <-answer:
				if code != http.StatusServiceUnavailable {
					t.Fatalf("an arrival answered %d while the slot was held", code)
				}
				shedAtOnce++
			default:
				queued = append(queued, answer)
			}
		}
		release <- struct{}{}
		if code := <-holder; code != http.StatusOK {
			t.Fatalf("the holder = %d", code)
		}
		for range queued { // each gets the slot in turn, whichever first
			release <- struct{}{}
		}
		for _, answer := range queued {
			if code := <-answer; code == http.StatusOK {
				served++
			}
		}
		for range served {
			<-entered
		}
		return shedAtOnce, served
	}

	// A brief wait (10ms, under the target), then two past it, 250ms
	// apart: the queue has stood for an interval.
	a := httpapi.NewAdmission(1, 100, 400*time.Millisecond, nil)
	if shed, served := then(a.Wrap(handler), steps(a.Wrap(handler), 10*time.Millisecond, 100*time.Millisecond, 250*time.Millisecond)); shed != 1 || served != 1 {
		t.Errorf("two arrivals during a standing queue: %d shed at once and %d served, want 1 and 1 (one turn of the one slot)", shed, served)
	}
	// Only brief waits: the queue drains, and both are queued and served.
	b := httpapi.NewAdmission(1, 100, 400*time.Millisecond, nil)
	if shed, served := then(b.Wrap(handler), steps(b.Wrap(handler), 10*time.Millisecond, 10*time.Millisecond)); shed != 0 || served != 2 {
		t.Errorf("two arrivals behind a brief queue: %d shed and %d served, want both served", shed, served)
	}
}

// When the queue is found standing, what arrives is shed at once, and
// what was queued before is still served: a place in the queue is a
// promise (the bound keeps it within the target), so no request is shed after
// a wait. One slot, QueueTimeout 400ms (target 40ms, interval 80ms).
func TestAStandingQueueServesWhatItQueuedAndRefusesArrivals(t *testing.T) {
	handler, entered, release := heldHandler()
	h := httpapi.NewAdmission(1, 100, 400*time.Millisecond, nil).Wrap(handler)
	send := func() chan int { return sendTo(h) }
	holder := send()
	<-entered
	first := send() // waits 100ms: above the target, the interval starts
	time.Sleep(100 * time.Millisecond)
	release <- struct{}{}
	if code := <-holder; code != http.StatusOK {
		t.Fatalf("holder = %d", code)
	}
	<-entered
	second := send() // it and the third wait 250ms: the queue has stood for the interval
	time.Sleep(10 * time.Millisecond)
	third := send()
	time.Sleep(240 * time.Millisecond)
	release <- struct{}{} // the second takes the slot and finds the queue standing
	if code := <-first; code != http.StatusOK {
		t.Fatalf("first = %d", code)
	}
	<-entered
	select {
	case code := <-send():
		if code != http.StatusServiceUnavailable {
			t.Errorf("an arrival while the queue stands = %d, want 503", code)
		}
	case <-time.After(100 * time.Millisecond):
		t.Error("an arrival while the queue stands was queued, not shed at once")
	}
	select {
	case code := <-third:
		t.Fatalf("the third, queued before the queue was found standing, answered %d while the slot was held: want it served in its turn", code)
	default:
	}
	release <- struct{}{}
	if code := <-second; code != http.StatusOK {
		t.Errorf("second = %d", code)
	}
	<-entered
	release <- struct{}{}
	if code := <-third; code != http.StatusOK {
		t.Errorf("the third, queued 250ms before the queue was found standing = %d, want it served", code)
	}
}

// The queue is as long as drains within the target at the rate slots come
// free: with one slot held 500ms a time, a queue of more than 8 (the
// shortest bound) could not drain within the target (200ms of a 2s
// QueueTimeout), and the excess is shed as it arrives; with the slot
// held a few milliseconds, the same arrivals all queue. Each case: one
// request holds the slot, two queue behind it, the holder leaves after
// hold (the service learns how long a slot is held), and ten more arrive.
func TestTheQueueIsAsLongAsDrainsWithinTheTarget(t *testing.T) {
	for _, tc := range []struct {
		hold time.Duration
		shed int
	}{
		{500 * time.Millisecond, 3}, // the waiter left from before + seven make the bound of 8
		{2 * time.Millisecond, 0},   // 1 slot × 200ms ÷ 2ms: room for 100
	} {
		handler, entered, release := heldHandler()
		h := httpapi.NewAdmission(1, 100, 2*time.Second, nil).Wrap(handler)
		holder := sendTo(h)
		<-entered
		next, stale := sendTo(h), sendTo(h) // stale: still queued when the ten arrive
		time.Sleep(tc.hold)
		release <- struct{}{}
		<-entered // next or stale has the slot; the other waits
		if code := <-holder; code != http.StatusOK {
			t.Fatalf("hold %s: the holder = %d", tc.hold, code)
		}
		var queued []chan int
		shed := 0
		for range 10 {
			answer := sendTo(h)
			select {
			case code := <-answer:
				if code != http.StatusServiceUnavailable {
					t.Fatalf("hold %s: an arrival answered %d before the slot came free", tc.hold, code)
				}
				shed++
			case <-time.After(20 * time.Millisecond): // queued
				queued = append(queued, answer)
			}
		}
		// A refusal is decided as the request arrives, but on a loaded
		// machine its answer may take longer than 20ms to come back. Until
		// the slot is released, nothing queued can be answered but by that
		// refusal (the queue timeout, 2s, is far off): whatever answers
		// within another 500ms was shed at once too.
		time.Sleep(500 * time.Millisecond)
		var stillQueued []chan int
		for _, answer := range queued {
			select {
			case code := <-answer:
				if code != http.StatusServiceUnavailable {
					t.Fatalf("hold %s: an arrival answered %d before the slot came free", tc.hold, code)
				}
				shed++
			default:
				stillQueued = append(stillQueued, answer)
			}
		}
		queued = stillQueued
		if shed != tc.shed {
			t.Errorf("slot held %s: %d of 10 arrivals shed at once, want %d", tc.hold, shed, tc.shed)
		}
		for range 2 + len(queued) {
			release <- struct{}{}
		}
		// Both first waiters are served, the one left waiting while the
		// arrivals were shed too: its place was a promise.
		for _, w := range []chan int{next, stale} {
			if code := <-w; code != http.StatusOK {
				t.Errorf("slot held %s: a first waiter = %d, want it served", tc.hold, code)
			}
		}
		for i, answer := range queued {
			if code := <-answer; code != http.StatusOK {
				t.Errorf("slot held %s: queued arrival %d = %d, want it served", tc.hold, i, code)
			}
		}
	}
}

// One slow hold is no estimate of how fast a burst drains: with four slots,
// the queue sets no bound of its own until four were given back since it
// formed. Four requests hold the slots, two queue; one holder leaves after
// 500ms (alone it would make the bound 8: 4 slots × 200ms ÷ 500ms is less),
// and ten more arrive: all queue, none is shed.
func TestOneSlowHoldSetsNoBound(t *testing.T) {
	handler, entered, release := heldHandler()
	h := httpapi.NewAdmission(4, 100, 2*time.Second, nil).Wrap(handler)
	var answers []chan int
	for range 4 {
		answers = append(answers, sendTo(h))
		<-entered
	}
	answers = append(answers, sendTo(h), sendTo(h))
	time.Sleep(500 * time.Millisecond)
	release <- struct{}{}
	<-entered // a waiter has the slot; one waits
	for range 10 {
		answer := sendTo(h)
		select {
		case code := <-answer:
			t.Fatalf("an arrival after one slow hold answered %d at once, want it queued", code)
		case <-time.After(20 * time.Millisecond):
		}
		answers = append(answers, answer)
	}
	for range len(answers) - 1 {
		release <- struct{}{}
	}
	for i, answer := range answers {
		if code := <-answer; code != http.StatusOK {
			t.Errorf("request %d = %d, want it served", i, code)
		}
	}
}

// Shedding ends with the overload. Forty (and sixty-four) clients, each sending its next
// request when the last is answered and waiting Retry-After when shed,
// against the defaults (32 slots, QueueTimeout 1s) and a service that takes
// 5ms a request, until the database stalls for 1.5s: the stall is overload,
// and requests are shed. Once it is gone the queue drains at once, and
// from CongestedFor after the stall on (what the requests shed during it
// may still congest, and a margin) no request is shed. Requests shed for
// the congestion itself once renewed it: forty clients kept it up for good.
// (Sixty-four fit too: 32 slots and a queue never shorter than the slots.)
func TestSheddingEndsWhenTheStallDoes(t *testing.T) {
	for _, clients := range []int{40, 64} {
		t.Run(strconv.Itoa(clients)+" clients", func(t *testing.T) {
			t.Parallel()
			sheddingAfterAStall(t, clients)
		})
	}
}

func sheddingAfterAStall(t *testing.T, clients int) {
	var stalled sync.Mutex // held while the database stalls
	h := httpapi.NewAdmission(32, 1024, time.Second, nil).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stalled.Lock()
		stalled.Unlock() //nolint:staticcheck // waits out the stall
		time.Sleep(5 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	}))
	var (
		mu     sync.Mutex
		shedAt []time.Time
		served int
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/orders", nil))
				shed := rec.Code == http.StatusServiceUnavailable
				mu.Lock()
				if shed {
					shedAt = append(shedAt, time.Now())
				} else {
					served++
				}
				mu.Unlock()
				if shed {
					after, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
					time.Sleep(time.Duration(after) * time.Second)
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	stalled.Lock()
	time.Sleep(1500 * time.Millisecond)
	stalled.Unlock()
	stallEnd := time.Now()
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()

	calm := stallEnd.Add(httpapi.CongestedFor + 500*time.Millisecond)
	during, after := 0, 0
	for _, at := range shedAt {
		if at.After(calm) {
			after++
		} else {
			during++
		}
	}
	t.Logf("%d served, %d shed up to %s after the stall, %d after that", served, during, calm.Sub(stallEnd), after)
	if during == 0 {
		t.Error("nothing was shed during the stall: the test did not overload the service")
	}
	if after != 0 {
		t.Errorf("%d requests shed in the %s after the stall was gone (from %s after it), want none: the clients honour Retry-After and fit in the slots and the queue",
			after, time.Since(calm).Round(time.Second), calm.Sub(stallEnd))
	}
}

// Once the congestion ends, the queue is judged afresh: a waiter after it
// that waits longer than the target starts an interval of evidence, and is
// no proof of a standing queue by itself, whatever the waiters before the
// congestion, or during it, showed. One slot, QueueTimeout 400ms (target
// 40ms, interval 80ms).
func TestTheQueueIsJudgedAfreshAfterTheCongestion(t *testing.T) {
	handler, entered, release := heldHandler()
	h := httpapi.NewAdmission(1, 100, 400*time.Millisecond, nil).Wrap(handler)
	// waitBehind lets the holder go after hold, once next waits behind it,
	// and returns next, now holding the slot.
	waitBehind := func(holder, next chan int, hold time.Duration) chan int {
		time.Sleep(hold)
		release <- struct{}{}
		if code := <-holder; code != http.StatusOK {
			t.Fatalf("the holder = %d", code)
		}
		<-entered
		return next
	}
	holder := sendTo(h)
	<-entered
	// Waits of 100ms then 250ms: the queue stood for an interval.
	holder = waitBehind(holder, sendTo(h), 100*time.Millisecond)
	holder = waitBehind(holder, sendTo(h), 250*time.Millisecond)
	// While it stands, one turn of the slot may wait (its wait is no
	// evidence: it queued during the congestion), and the other is shed.
	var during chan int
	shed := 0
	for _, answer := range []chan int{sendTo(h), sendTo(h)} {
		code, queued := queuedWithin(answer, 100*time.Millisecond)
		switch {
		case queued:
			during = answer
		case code == http.StatusServiceUnavailable:
			shed++
		default:
			t.Fatalf("an arrival while the queue stands = %d, want it queued or 503", code)
		}
	}
	if shed != 1 || during == nil {
		t.Fatalf("of two arrivals while the queue stands, %d were shed, want 1: the test did not congest the service", shed)
	}
	holder = waitBehind(holder, during, 0)
	time.Sleep(httpapi.CongestedFor + 100*time.Millisecond)
	// One wait of 60ms (above the target): an interval of evidence starts.
	holder = waitBehind(holder, sendTo(h), 60*time.Millisecond)
	// Two arrivals: both queue. Had the evidence before carried over, the
	// 60ms wait would have congested the service and the second been shed.
	var queued []chan int
	for i, answer := range []chan int{sendTo(h), sendTo(h)} {
		if code, ok := queuedWithin(answer, 20*time.Millisecond); !ok {
			t.Errorf("arrival %d after one slow wait, past the congestion, answered %d at once: want it queued", i, code)
			continue
		}
		queued = append(queued, answer)
	}
	release <- struct{}{}
	<-holder
	for range queued {
		<-entered
		release <- struct{}{}
	}
	for i, answer := range queued {
		if code := <-answer; code != http.StatusOK {
			t.Errorf("last arrival %d = %d, want it served", i, code)
		}
	}
}

// heldHandler answers 200 once the test lets it: each request it serves
// says so on entered, then holds its slot until a value on release.
func heldHandler() (h http.Handler, entered, release chan struct{}) {
	entered, release = make(chan struct{}, 16), make(chan struct{}, 16)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusOK)
	}), entered, release
}

// sendTo sends a create to h in the background; its status arrives on the
// channel returned.
func sendTo(h http.Handler) chan int {
	out := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/orders", nil))
		out <- rec.Code
	}()
	return out
}
