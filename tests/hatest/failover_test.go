//go:build ha

package hatest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
)

// newLoad is a load of one tenant through the given instances.
func newLoad(tenant string, urls ...string) *load {
	l := &load{log: &attemptLog{}}
	for _, u := range urls {
		l.clients = append(l.clients, newClient(u, tenants[tenant], l.log))
	}
	return l
}

// runLoad starts the load and returns a function that stops it and waits.
func runLoad(l *load, workers int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx, workers); close(done) }()
	return func() { cancel(); <-done }
}

// waitIntents waits until the load has made n intents (bounded, so that a
// broken run fails instead of hanging).
func waitIntents(t *testing.T, l *load, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(l.all()) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the load made only %d intents in 30s", len(l.all()))
		}
	}
}

// firstWriteAfter waits for a 2xx POST sent after since and returns its end.
func firstWriteAfter(t *testing.T, l *load, since time.Time, within time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if first := l.tally(since, since, since).firstOKAfter; !first.IsZero() {
			return first
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write succeeded within %s after %s", within, since.Format(time.TimeOnly))
		}
	}
}

// Scenario 1: SIGKILL of the primary's node in the middle of a create and
// pay storm through two instances.
func TestPrimaryNodeKilledMidStorm(t *testing.T) {
	a, b, l, stop, leader, replica := loadTwoInstances(t, "storm", 12)
	defer stop()
	commitsInDoubt()
	killAt := time.Now()
	if err := ha.cluster.crash(leader); err != nil {
		t.Fatal(err)
	}
	promotedAt := waitPrimary(t, replica, 60*time.Second)
	resumedAt := firstWriteAfter(t, l, killAt, 60*time.Second)
	time.Sleep(3 * time.Second) // keep the storm on the new primary a while
	stop()
	inDoubt := commitsInDoubt()

	tl := l.tally(killAt, killAt, resumedAt)
	tl.resentAfterGivingUp = l.converge(t)
	verify(t, ha.directURL, "storm", l, ha.channel, &tl)

	t.Run("writes resume within 15 s of the kill", func(t *testing.T) {
		if d := resumedAt.Sub(killAt); d > 15*time.Second {
			t.Errorf("the first write after the kill succeeded %s after it", d)
		}
	})
	t.Run("the instances never needed a restart", func(t *testing.T) {
		for _, m := range []string{a.URL(), b.URL()} {
			if s := ready(m); s != http.StatusOK {
				t.Errorf("%s readyz = %d", m, s)
			}
		}
	})
	doubtSummary, doubtKeys := l.resolveInDoubt(inDoubt)
	for _, k := range doubtKeys {
		t.Logf("in doubt: %s", k)
	}
	figure(t, "scenario 1 (SIGKILL of %s mid-storm): promotion of %s %s after the kill; first write %s after the kill; last failed attempt %s after the kill; COMMITs that reached a node and whose answer never reached the service: %d (%s); %s",
		leader.name, replica.name, promotedAt.Sub(killAt).Round(10*time.Millisecond), resumedAt.Sub(killAt).Round(10*time.Millisecond),
		after(killAt, tl.lastFailure), len(inDoubt), doubtSummary, tl)
}

// loadTwoInstances starts two instances on a healthy cluster with workers
// clients of tenant against them, waits until 60 intents went through, and
// names the cluster's leader and its other node.
func loadTwoInstances(t *testing.T, tenant string, workers int) (a, b *app.Main, l *load, stop func(), leader, other *node) {
	t.Helper()
	healthy(t)
	a, b = startInstance(t, nil), startInstance(t, nil)
	l = newLoad(tenant, a.URL(), b.URL())
	stop = runLoad(l, workers)
	waitIntents(t, l, 60)
	leader, err := ha.cluster.leader()
	if err != nil {
		stop()
		t.Fatal(err)
	}
	return a, b, l, stop, leader, ha.cluster.other(leader)
}
