package idempotency

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Window is a source that can send the same intent again, and for how long:
// client retries, message redelivery, manual compensation.
type Window struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
}

// Policy derives how long a finished record is kept. Deleting a record while
// any source can still replay its intent would let the replay run again, so
// retention is the longest replay window plus a margin, and money operations
// may be kept longer still (and are archived, not just deleted).
type Policy struct {
	Windows []Window
	// Chained names windows that follow one another: a client's retry may
	// be a message, which the broker then redelivers for its own window. A
	// record must outlive their sum, as well as each window alone.
	Chained []string
	// Retention overrides the derived retention when set; Check
	// refuses one shorter than a replay window.
	Retention       time.Duration
	Margin          time.Duration
	MoneyFloor      time.Duration
	MoneyOperations []string
	// Operations lists every operation the policy covers, for Describe.
	Operations []string
	// Webhook is how long the payment channel may deliver a webhook again.
	// A delivery is remembered in the webhook inbox (InboxRetention), not
	// in a record, so this window does not lengthen the records' retention.
	Webhook time.Duration
}

// Longest is the longest replay window, or the chain of windows when that
// is longer.
func (p Policy) Longest() Window {
	var longest Window
	for _, w := range p.Windows {
		if w.Duration > longest.Duration {
			longest = w
		}
	}
	if c := p.chain(); c.Duration > longest.Duration {
		longest = c
	}
	return longest
}

// chain is the chained windows one after another, named a+b.
func (p Policy) chain() Window {
	var c Window
	var names []string
	for _, w := range p.Windows {
		if slices.Contains(p.Chained, w.Name) {
			c.Duration += w.Duration
			names = append(names, w.Name)
		}
	}
	c.Name = strings.Join(names, "+")
	return c
}

// Window is the duration of the window name (zero when there is none).
func (p Policy) Window(name string) time.Duration {
	for _, w := range p.Windows {
		if w.Name == name {
			return w.Duration
		}
	}
	return 0
}

// Shortest is the shortest retention of any operation: what every record
// is sure to outlive.
func (p Policy) Shortest() time.Duration {
	shortest := p.RetentionFor("")
	for _, op := range p.Operations {
		shortest = min(shortest, p.RetentionFor(op))
	}
	return shortest
}

// InboxRetention is how long a webhook delivery is remembered: the
// channel's replay window plus the margin.
func (p Policy) InboxRetention() time.Duration { return p.Webhook + p.Margin }

// IsMoney reports whether operation moves money, so its records are archived.
func (p Policy) IsMoney(operation string) bool { return slices.Contains(p.MoneyOperations, operation) }

// RetentionFor is how long a finished record of operation is kept.
func (p Policy) RetentionFor(operation string) time.Duration {
	r := p.Longest().Duration + p.Margin
	if p.Retention > 0 {
		r = p.Retention
	}
	if p.IsMoney(operation) && p.MoneyFloor > r {
		r = p.MoneyFloor
	}
	return r
}

// Check refuses any combination of settings under which a record could
// expire while a replay source may still send its intent again: a negative
// window or margin, or a configured retention shorter than the longest
// window plus the margin. The error names the window that makes it unsafe.
func (p Policy) Check() error {
	for _, w := range p.Windows {
		if w.Duration < 0 {
			return fmt.Errorf("the %s window (%s) must not be negative", w.Name, w.Duration)
		}
	}
	if p.Webhook < 0 {
		return fmt.Errorf("the webhook window (%s) must not be negative", p.Webhook)
	}
	if p.Margin < 0 {
		return fmt.Errorf("retention margin %s is unsafe: it must not be negative, or records would expire inside the %s window", p.Margin, p.Longest().Name)
	}
	if p.MoneyFloor < 0 {
		return fmt.Errorf("money retention floor %s must not be negative", p.MoneyFloor)
	}
	if p.Retention == 0 {
		return nil
	}
	longest := p.Longest()
	if need := longest.Duration + p.Margin; p.Retention < need {
		return fmt.Errorf("retention %s is unsafe: the %s window replays for %s, so records must be kept at least %s (window plus margin)",
			p.Retention, longest.Name, longest.Duration, need)
	}
	return nil
}

// PolicyView describes the policy for whoever operates the service.
type PolicyView struct {
	ReplayWindows map[string]string    `json:"replay_windows"`
	LongestWindow string               `json:"longest_window"`
	Margin        string               `json:"margin"`
	MoneyFloor    string               `json:"money_floor"`
	Lease         string               `json:"lease"`
	Operations    []OperationRetention `json:"operations"`
	// WebhookInbox is how long a webhook delivery is remembered.
	WebhookInbox string `json:"webhook_inbox_retention"`
}

// OperationRetention is how long one operation's records are kept.
type OperationRetention struct {
	Operation string `json:"operation"`
	Retention string `json:"retention"`
	Archived  bool   `json:"archived"`
}

// Describe explains the policy: each window, and the retention it implies.
func (p Policy) Describe(lease time.Duration) PolicyView {
	v := PolicyView{ReplayWindows: map[string]string{}, LongestWindow: p.Longest().Name,
		Margin: p.Margin.String(), MoneyFloor: p.MoneyFloor.String(), Lease: lease.String()}
	for _, w := range p.Windows {
		v.ReplayWindows[w.Name] = w.Duration.String()
	}
	v.ReplayWindows["webhook"] = p.Webhook.String()
	v.WebhookInbox = p.InboxRetention().String()
	for _, op := range p.Operations {
		v.Operations = append(v.Operations, OperationRetention{Operation: op, Retention: p.RetentionFor(op).String(), Archived: p.IsMoney(op)})
	}
	return v
}
