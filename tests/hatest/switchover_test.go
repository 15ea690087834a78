//go:build ha

package hatest

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// Scenario 3: a planned switchover (patronictl switchover) under load. No
// error may reach the client that its retry does not fix, and the p99 of
// the calls made during the switch is the figure to know.
func TestSwitchoverUnderLoad(t *testing.T) {
	a, b, l, stop, leader, candidate := loadTwoInstances(t, "switch", 8)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	commitsInDoubt()
	switchAt := time.Now()
	if out, err := ha.cluster.switchover(ctx, leader, candidate); err != nil {
		t.Fatalf("patronictl switchover: %v\n%s", err, out)
	}
	promotedAt := waitPrimary(t, candidate, 60*time.Second)
	time.Sleep(3 * time.Second) // the load goes on against the new primary
	stop()
	inDoubt := commitsInDoubt()

	tl := l.tally(switchAt, switchAt, promotedAt.Add(time.Second))
	tl.resentAfterGivingUp = l.converge(t)
	verify(t, ha.directURL, "switch", l, ha.channel, &tl)
	t.Run("no call gave up: every error was fixed by the client's own retry", func(t *testing.T) {
		if tl.resentAfterGivingUp != 0 {
			t.Errorf("%d calls gave up and had to be resent", tl.resentAfterGivingUp)
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
	figure(t, "scenario 3 (switchover %s -> %s under load): %s writable %s after the command; last failed attempt %s after it; calls started during the switch: %d, p50 %s, p99 %s, max %s; COMMITs that reached a node and whose answer never reached the service: %d (%s); %s",
		leader.name, candidate.name, candidate.name, promotedAt.Sub(switchAt).Round(10*time.Millisecond),
		after(switchAt, tl.lastFailure), tl.windowCalls,
		tl.p50.Round(time.Millisecond), tl.p99.Round(time.Millisecond), tl.max.Round(time.Millisecond), len(inDoubt), doubtSummary, tl)
}
