package messaging

import (
	"math"
	"testing"
	"time"
)

// How much longer a command may wait for its intent in flight: until half
// of ORDER_COMMANDS's max_age after the stream stored this copy, and never
// past the horizon after it was first published (a replay of its dead
// letter keeps that time), whichever comes first; with neither, no bound.
func TestPostponeLeft(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	stored := delivery{stored: now.Add(-time.Hour), published: now.Add(-time.Hour)}
	replayed := delivery{stored: now.Add(-time.Hour), published: now.Add(-100 * time.Hour)}
	for _, tc := range []struct {
		name            string
		maxAge, horizon time.Duration
		d               delivery
		want            time.Duration
	}{
		{"no bound", 0, 0, stored, time.Duration(math.MaxInt64)},
		{"half the max_age from its storing", 168 * time.Hour, 0, stored, 83 * time.Hour},
		{"the horizon from its first publication", 0, 48 * time.Hour, stored, 47 * time.Hour},
		{"the nearer of the two: half the max_age", 168 * time.Hour, 200 * time.Hour, stored, 83 * time.Hour},
		{"the nearer of the two: the horizon of a replayed letter", 168 * time.Hour, 150 * time.Hour, replayed, 50 * time.Hour},
		{"past half the max_age: negative, so any wait is too long", 60 * time.Minute, 0, stored, -30 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Consumer{MaxAge: tc.maxAge, Horizon: tc.horizon}
			if got := c.postponeLeft(tc.d, now); got != tc.want {
				t.Errorf("postponeLeft = %s, want %s", got, tc.want)
			}
		})
	}
}

// One waiter per intent and at most perTenant waiters per tenant; a
// tenant's waiters leave no mark on another's share.
func TestWaitersAreOnePerIntentAndBoundedPerTenant(t *testing.T) {
	w := newWaiters()
	pay := func(tenant, key string) command { return command{tenant: tenant, op: "pay", key: key} }
	if why := w.enter(pay("acme", "k1"), 2); why != "" {
		t.Fatalf("acme's first waiter: %s", why)
	}
	if why := w.enter(pay("acme", "k1"), 2); why == "" {
		t.Error("a second waiter for acme's k1 entered, want one per intent")
	}
	if why := w.enter(command{tenant: "acme", op: "cancel", key: "k1"}, 2); why != "" {
		t.Errorf("acme's cancel under k1 is another intent: %s", why)
	}
	if why := w.enter(pay("acme", "k2"), 2); why == "" {
		t.Error("acme's third waiter entered, want at most 2")
	}
	if why := w.enter(pay("globex", "k1"), 2); why != "" {
		t.Errorf("globex's first waiter, beside acme's 2: %s", why)
	}
	if a, g := w.waiting("acme"), w.waiting("globex"); a != 2 || g != 1 {
		t.Errorf("waiting: acme %d, globex %d; want 2, 1", a, g)
	}
	w.leave(pay("acme", "k1"))
	if why := w.enter(pay("acme", "k2"), 2); why != "" {
		t.Errorf("acme's waiter after one left: %s", why)
	}
	if why := w.enter(pay("acme", "k1"), 2); why == "" {
		t.Error("acme's k1 entered again while acme has 2 waiters")
	}
}

// A delivery that handed its command back spends no delivery: the
// delivery that brings the command again takes its hand-backs off its
// count, and carries them on if it hands it back too. One not brought
// back to this instance within keep is forgotten.
func TestHandedBackDeliveriesAreNotSpent(t *testing.T) {
	w := newWaiters()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	stored := now.Add(-time.Minute)
	first := delivery{seq: 7, stored: stored, count: 1}
	w.handBack(first, now, time.Hour)

	second := delivery{seq: 7, stored: stored, count: 2}
	if n := w.takeHandedBack(second); n != 1 {
		t.Fatalf("hand-backs before the second delivery = %d, want 1", n)
	}
	second.handedBack = 1
	w.handBack(second, now.Add(time.Second), time.Hour)
	if n := w.takeHandedBack(delivery{seq: 7, stored: stored, count: 3}); n != 2 {
		t.Errorf("hand-backs before the third delivery = %d, want 2: the third is its first spent", n)
	}
	if n := w.takeHandedBack(delivery{seq: 7, stored: stored, count: 4}); n != 0 {
		t.Errorf("hand-backs before the fourth = %d, want 0: the third took them", n)
	}
	if n := w.takeHandedBack(delivery{seq: 8, stored: stored, count: 2}); n != 0 {
		t.Errorf("another command's hand-backs = %d, want 0", n)
	}
	if n := w.takeHandedBack(delivery{seq: 7, stored: stored.Add(time.Nanosecond), count: 2}); n != 0 {
		t.Errorf("a recreated stream's command 7 = %d, want 0: another copy", n)
	}

	w.handBack(delivery{seq: 9, stored: stored, count: 1}, now, time.Hour)
	w.handBack(delivery{seq: 10, stored: stored, count: 1}, now.Add(2*time.Hour), time.Hour) // forgets 9
	if n := w.takeHandedBack(delivery{seq: 9, stored: stored, count: 2}); n != 0 {
		t.Errorf("hand-backs of a command not brought back within the hour = %d, want 0: forgotten", n)
	}
	if n := w.takeHandedBack(delivery{seq: 10, stored: stored, count: 2}); n != 1 {
		t.Errorf("hand-backs of command 10 = %d, want 1", n)
	}
}
