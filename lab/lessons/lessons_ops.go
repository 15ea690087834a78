package lessons

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// 9. The retention policy.
func retention(ctx context.Context, s *Session) error {
	s.send("GET /v1/idempotency-policy")
	p, err := s.policy(ctx)
	if err != nil {
		return err
	}
	type window struct {
		name string
		dur  time.Duration
	}
	var windows []window
	var webhook window // the channel's webhooks: remembered in the inbox, not in records
	for name, s := range p.ReplayWindows {
		dur, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("replay window %s: %w", name, err)
		}
		if name == "webhook" {
			webhook = window{name, dur}
			continue
		}
		windows = append(windows, window{name, dur})
	}
	slices.SortFunc(windows, func(a, b window) int { return cmp.Compare(a.dur, b.dur) })
	oneDay := 24 * time.Hour
	rows := [][]string{{"replay window", "replays for", "covered by a 1-day retention?"}}
	for _, w := range windows {
		covered := "yes"
		switch {
		case w.dur > oneDay:
			covered = "no: a replay after day 1 finds no record and runs again"
		case w.dur == oneDay:
			covered = "only just: no margin for a slow first attempt or clock skew"
		}
		rows = append(rows, []string{w.name, days(w.dur), covered})
	}
	s.table(rows)
	s.got("longest window %s, margin %s, money floor %s, lease %s", p.LongestWindow, dayString(p.Margin), dayString(p.MoneyFloor), dayString(p.Lease))

	rows = [][]string{{"operation", "records kept for", "then"}}
	allCover, moneyArchived := true, true
	longest := windows[len(windows)-1]
	for _, op := range p.Operations {
		kept, err := time.ParseDuration(op.Retention)
		if err != nil {
			return fmt.Errorf("retention of %s: %w", op.Operation, err)
		}
		then := "deleted"
		if op.Archived {
			then = "archived, then deleted"
		}
		rows = append(rows, []string{op.Operation, days(kept), then})
		allCover = allCover && kept > longest.dur
		if op.Operation == "order.pay" || op.Operation == "order.cancel" {
			moneyArchived = moneyArchived && op.Archived
		}
	}
	s.table(rows)
	inbox, err := time.ParseDuration(p.WebhookInbox)
	if err != nil {
		return fmt.Errorf("webhook inbox retention: %w", err)
	}
	s.got("the payment channel's webhooks replay for %s; each delivery's id is kept in the webhook inbox for %s",
		days(webhook.dur), days(inbox))

	s.check(inbox > webhook.dur && webhook.dur > oneDay,
		"the webhook inbox outlives the channel's retries too (%s > %s): a late redelivery finds its id", days(inbox), days(webhook.dur))
	s.check(len(windows) == 3, "the policy names the three replay sources (client retries, broker redelivery, manual compensation)")
	s.check(longest.dur > oneDay, "one day is unsafe here: %s replays for %s", longest.name, days(longest.dur))
	s.check(len(p.Operations) > 0 && allCover, "every operation's records outlive the longest window (%s)", days(longest.dur))
	s.check(moneyArchived, "money operations (order.pay, order.cancel) are archived, not just deleted")
	return nil
}

// days writes a duration in days when it is whole days: 720h is "30d".
func days(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
	return d.String()
}

// dayString is days for a duration as the service writes it ("720h0m0s").
func dayString(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil {
		return s
	}
	return days(d)
}

// 10. The metrics that moved.
func metricsMoved(ctx context.Context, s *Session) error {
	s.send("GET /metrics  (scraped before lesson 1, and now)")
	now, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	deltas, instances := moved(s.metricsAtStart, now)
	s.got("%d orderservice_* series moved, over %d service instance(s) (HTTP latency histograms left out)", len(deltas), instances)
	rows := [][]string{{"series", "before", "after", "change"}}
	for _, m := range deltas {
		rows = append(rows, []string{m.series, number(m.before), number(m.after), fmt.Sprintf("%+g", m.after-m.before)})
	}
	if len(deltas) > 0 {
		s.table(rows)
	}
	if n := increase(deltas, "orderservice_webhooks_received_total", `outcome="ignored"`); n > 0 {
		s.note(`outcome="ignored" +%s: the channel tells the outcome of every charge and refund by webhook, also of those`, number(n))
		s.note("it answered at once. The service had stored those from the answer (and knows none of another client's, such as")
		s.note("the pitfalls' naive service), so their webhooks move nothing: only a payment still pending, lesson 14's, is applied.")
	}
	for _, series := range now {
		if v, ok := series["orderservice_idempotency_processing_expired"]; ok {
			s.note("orderservice_idempotency_processing_expired (stuck PROCESSING) is %s now: nothing was left behind", number(v))
			break
		}
	}

	// Each signal, and the lesson that moved it.
	expected := []struct {
		lesson int
		what   string
		name   string
		labels []string
	}{
		{1, "replays (outcome=replayed)", "orderservice_idempotent_requests_total", []string{`outcome="replayed"`}},
		{3, "parameter conflicts (422)", "orderservice_idempotency_key_conflicts_total", nil},
		{4, "in-flight duplicates (409)", "orderservice_idempotent_requests_total", []string{`outcome="in_progress"`}},
		{7, "downstream duplicates absorbed by the channel", "orderservice_payment_channel_duplicates_absorbed_total", nil},
		{7, "takeovers by a retry", "orderservice_idempotency_takeovers_total", []string{`by="retry"`}},
		{8, "takeovers by the sweeper", "orderservice_idempotency_takeovers_total", []string{`by="sweeper"`}},
		{9, "commands answered from the records (Idempotent-Replayed)", "orderservice_messages_replayed_total", nil},
		{11, "command redeliveries", "orderservice_messages_redelivered_total", nil},
		{11, "commands dead-lettered", "orderservice_messages_dead_lettered_total", nil},
		{12, "outbox events the relay published", "orderservice_outbox_relay_publishes_total", []string{`result="published"`}},
		{14, "webhook deliveries the inbox absorbed", "orderservice_webhooks_received_total", []string{`outcome="duplicate"`}},
	}
	checked := false
	for _, e := range expected {
		if !s.ran(e.lesson) {
			continue
		}
		checked = true
		n := increase(deltas, e.name, e.labels...)
		s.check(n > 0, "%s: +%s (first caused by lesson %d)", e.what, number(n), e.lesson)
	}
	if !checked {
		s.check(instances > 0, "metrics were scraped (run the other lessons to see them move)")
	}
	return nil
}

func number(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
