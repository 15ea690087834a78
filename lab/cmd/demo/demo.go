package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/orderservice/orderservice/lab/lessons"
)

// terminal renders a session's events as the narration the demo prints:
// what the client sends (→), what comes back (←), asides, the "why" and
// the checks. The timeline's wire events (requests, record and charge
// lanes) are the lab's; the narration already says what they show.
type terminal struct {
	out   io.Writer
	color bool
}

// play runs every selected lesson in order and sums up. It returns an
// error naming the lessons whose checks failed.
func (t *terminal) play(ctx context.Context, s *lessons.Session, cfg config, list []lessons.Lesson) error {
	t.printf("%s\n", t.paint(bold, "Request idempotency, lesson by lesson"))
	t.printf("service %s · channel %s · broker %s as %s · run id %s (every key below starts with it)\n",
		cfg.BaseURL, cfg.ChannelURL, cfg.NATSURL, cfg.Tenant, s.RunID())
	// The names the lessons' titles use, before the first title uses them.
	t.printf("%s\n", t.paint(dim, wrap(legend, 80, "")))

	var passed, failed []string
	pitfalls := false
	for _, l := range list {
		if len(cfg.only) > 0 && !cfg.only[l.Number] {
			continue
		}
		if l.Pitfall != "" && !pitfalls {
			pitfalls = true
			t.printf("\n%s\n", t.paint(bold, "The pitfalls, shown failing"))
			t.printf("   %s\n", t.paint(dim, wrap("Each lesson below makes one common mistake in a naive order service (lab/naiveorders, "+
				"run in this process, its tables in "+redacted(cfg.NaiveDatabaseURL)+") and counts the harm, then takes the same steps against the service.", 76, "   ")))
		}
		name := fmt.Sprintf("%d. %s", l.Number, l.Title)
		if s.Play(ctx, l, nil).Passed {
			passed = append(passed, name)
		} else {
			failed = append(failed, name)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	t.printf("\n%s %d of %d scenarios passed\n", t.paint(bold, "Summary:"), len(passed), len(passed)+len(failed))
	for _, name := range passed {
		t.printf("   %s %s\n", t.mark(true), name)
	}
	for _, name := range failed {
		t.printf("   %s %s\n", t.mark(false), name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d scenario(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// legend explains the names the lessons use from their first title on, as
// the seed's story does.
const legend = "R1, R2, R3 name a lesson's Idempotency-Keys, one per intent (sent as <run id>-<lesson>-R1, …). " +
	"O9 is the order a lesson creates under R1; O10 would be a second order for the same intent, which a retry must never make."

// event prints one event of the narration.
func (t *terminal) event(e lessons.Event) {
	switch e.Kind {
	case lessons.KindLessonStart:
		t.printf("\n%s\n", t.paint(bold+cyan, fmt.Sprintf("%d. %s", e.Lesson, e.Text)))
	case lessons.KindSay:
		switch {
		case e.Style == lessons.StyleSend:
			t.printf("   %s %s\n", t.paint(cyan, "→"), e.Text)
		case e.Style == lessons.StyleGot:
			t.printf("   %s %s\n", t.paint(green, "←"), e.Text)
		case e.Text == "":
			t.printf("\n")
		default:
			t.printf("   %s\n", t.paint(dim, e.Text))
		}
	case lessons.KindTable:
		t.table(e.Rows)
	case lessons.KindWhy:
		t.printf("   %s %s\n", t.paint(bold, "why:"), wrap(e.Text, 76, "        "))
	case lessons.KindCheck:
		t.printf("   %s %s\n", t.mark(e.OK), e.Text)
	case lessons.KindLessonEnd:
		if e.Text != "" {
			t.printf("   %s could not finish: %s\n", t.mark(false), e.Text)
		}
	}
}

const (
	bold  = "\x1b[1m"
	dim   = "\x1b[2m"
	red   = "\x1b[31m"
	green = "\x1b[32m"
	cyan  = "\x1b[36m"
	reset = "\x1b[0m"
)

// paint colours s when the output is a terminal; plain output stays plain.
func (t *terminal) paint(style, s string) string {
	if !t.color {
		return s
	}
	return style + s + reset
}

func (t *terminal) mark(ok bool) string {
	if ok {
		return t.paint(green, "✓")
	}
	return t.paint(red, "✗")
}

func (t *terminal) printf(format string, args ...any) { fmt.Fprintf(t.out, format, args...) }

// table prints rows as aligned columns, the first row as the header.
func (t *terminal) table(rows [][]string) {
	if len(rows) == 0 {
		return
	}
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			if i < len(widths) {
				widths[i] = max(widths[i], len([]rune(c)))
			}
		}
	}
	for n, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if i < len(r)-1 && i < len(widths) {
				c += strings.Repeat(" ", widths[i]-len([]rune(c))+2)
			}
			b.WriteString(c)
		}
		line := strings.TrimRight(b.String(), " ")
		if n == 0 {
			line = t.paint(bold, line)
		}
		t.printf("     %s\n", line)
	}
}

// redacted is a database URL without its password.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// wrap breaks text into lines of at most width runes, indenting every line
// but the first.
func wrap(text string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(text) {
		if i > 0 && n+1+len([]rune(w)) > width {
			b.WriteString("\n" + indent)
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len([]rune(w))
	}
	return b.String()
}
