package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orderservice/orderservice/lab/lessons"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "lab"))
}

// screenshot is where the README's picture of the lab is written.
const screenshot = "../../../docs/lab.png"

// brokerRow is a row of the broker lane.
type brokerRow struct {
	Kind       string `json:"kind"`
	Subject    string `json:"subject"`
	Key        string `json:"key"`
	Status     int    `json:"status"`
	Replayed   bool   `json:"replayed"`
	Duplicate  bool   `json:"duplicate"`
	MsgID      string `json:"msgId"`
	Deliveries int    `json:"deliveries"`
}

// page is what the browser shows after a lesson, read from the DOM.
type page struct {
	Status string `json:"status"`
	Checks []struct {
		OK   bool   `json:"ok"`
		Text string `json:"text"`
	} `json:"checks"`
	Why      string `json:"why"`
	Requests []struct {
		ID     int    `json:"id"`
		Key    string `json:"key"`
		Op     string `json:"op"`
		Resend int    `json:"resend"`
		Naive  string `json:"naive"` // the mistake of the naive service it went to
	} `json:"requests"`
	// Traces are the requests' links to their traces.
	Traces []struct {
		Href    string `json:"href"`
		TraceID string `json:"traceId"`
	} `json:"traces"`
	NaiveBadges int `json:"naiveBadges"`
	Answers     []struct {
		Request  int  `json:"request"`
		Status   int  `json:"status"`
		Replayed bool `json:"replayed"`
		Retry    bool `json:"retry"`
	} `json:"answers"`
	Records []struct {
		State string `json:"state"`
		Token int    `json:"token"`
	} `json:"records"`
	Charges []struct {
		ID       string `json:"id"`
		Requests int    `json:"requests"`
	} `json:"charges"`
	Messages []brokerRow `json:"messages"`
	Orders   []string    `json:"orders"`
	// Says are the narration's lines on the timeline.
	Says   []string `json:"says"`
	Tables int      `json:"tables"`
	Charts int      `json:"charts"`
	Waits  int      `json:"waits"`
}

const readPage = `(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  const b = document.querySelector('#lessons button[aria-current="true"]');
  return {
    status: b ? b.dataset.status : "",
    checks: q("#checks li").map((li) => ({ ok: li.dataset.ok === "true", text: li.textContent })),
    why: document.getElementById("why").textContent,
    requests: q('#rows li[data-kind="req"]').map((li) => ({ id: +li.dataset.request, key: li.dataset.key, op: li.dataset.operation,
      resend: +li.dataset.resend, naive: li.dataset.naive })),
    traces: q('#rows li[data-kind="req"] a.trace').map((a) => ({ href: a.getAttribute("href"), traceId: a.closest("li").dataset.traceId })),
    naiveBadges: q('#rows li[data-kind="req"] .badge.naive').length,
    answers: q('#rows li[data-kind="ans"]').map((li) => ({ request: +li.dataset.request, status: +li.dataset.status,
      replayed: li.dataset.replayed === "true", retry: !!li.querySelector(".badge.retry") })),
    records: q('#rows li[data-kind="rec"]').map((li) => ({ state: li.dataset.state, token: +li.dataset.leaseToken })),
    charges: q('#rows li[data-kind="chg"]').map((li) => ({ id: li.dataset.charge, requests: +li.dataset.requests })),
    messages: q('#rows li[data-kind="msg"]').map((li) => ({ kind: li.dataset.msgKind, subject: li.dataset.subject, key: li.dataset.key,
      status: +li.dataset.status, replayed: li.dataset.replayed === "true", duplicate: li.dataset.duplicate === "true",
      msgId: li.dataset.msgId, deliveries: +li.dataset.deliveries })),
    orders: q('#rows li[data-kind="ord"]').map((li) => li.dataset.order),
    says: q('#rows li[data-kind="say"]').map((li) => li.textContent),
    tables: q('#rows li[data-kind="tbl"]').length,
    waits: q("#rows li.wait").length,
    charts: q("#metrics .chart").length,
  };
})()`

// TestLabInABrowser plays every lesson in a real headless Chromium against
// the real service booted in process, and checks what the page shows: the
// checks all green, and the timeline rows each lesson's story needs.
func TestLabInABrowser(t *testing.T) {
	began := time.Now()
	m := apptest.Start(t, dbURL, apptest.LessonEnv)
	channelURL := "http://" + m.ChannelAddr
	// A bound against a hang, with room for the whole suite's load (the
	// test takes about a minute idle, half as much again loaded).
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	srv, err := start(ctx, config{listen: "127.0.0.1:0", Config: lessons.Config{
		BaseURL: m.URL(), ChannelURL: channelURL, APIKey: apptest.KeyAcme, SweepWait: 15 * time.Second, Observe: true,
		Tenant: "acme", NATSURL: m.NATSURL, NATSOperator: "orderservice:" + m.Config.NATS.ServicePassword,
		NaiveDatabaseURL: dbURL, NeighbourAPIKey: apptest.KeyGlobex, NeighbourTenant: "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.close(context.Background()) })

	browser := apptest.Browser(ctx, t, 1440, 900)
	if err := chromedp.Do(browser,
		chromedp.EmulateViewport(1440, 900),
		chromedp.Navigate("http://"+srv.addr+"/"),
		waitVisible(`#lessons button[data-lesson="10"]`),
		waitVisible(`#live[data-live="true"]`),
	); err != nil {
		t.Fatalf("the lab's page did not load in Chromium: %v", err)
	}

	t.Run("the page loads without a 404 and says that a click runs a lesson", func(t *testing.T) {
		// The icon the page names, and the one a browser asks for unasked.
		icons, err := chromedp.Run(browser, chromedp.Evaluate[[]string](`Promise.all([document.querySelector('link[rel="icon"]').href, "/favicon.ico"].map((u) =>
  fetch(u).then((r) => r.status + " " + r.headers.get("Content-Type"))))`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range icons {
			if !strings.HasPrefix(got, "200 image/svg+xml") {
				t.Errorf("the lab's icon: %q, want 200 image/svg+xml (a browser asks for it on every load)", got)
			}
		}
		intro := evaluate[string](t, browser, `document.getElementById("intro").textContent`)
		if !strings.Contains(intro, "Click it in the list") {
			t.Errorf("the intro = %q; a click on a lesson runs it, and the intro must say so", intro)
		}
		// The titles' names are explained before a lesson uses them.
		empty := evaluate[string](t, browser, `document.querySelector("#rows .empty").textContent`)
		for _, name := range []string{"R1", "O9", "O10"} {
			if !strings.Contains(empty, name) {
				t.Errorf("the empty timeline does not explain %s, which lesson 1's title uses: %q", name, empty)
			}
		}
	})

	// play runs lesson n from the page (by keyboard when stepping) and
	// returns what the page shows once it is done.
	play := func(t *testing.T, n int, actions ...chromedp.Action[chromedp.Void]) page {
		t.Helper()
		lctx, cancel := context.WithTimeout(browser, time.Minute)
		defer cancel()
		if len(actions) == 0 {
			actions = []chromedp.Action[chromedp.Void]{click(fmt.Sprintf(`#lessons button[data-lesson="%d"]`, n))}
		}
		// The page may still show this lesson done from an earlier run
		// until the new run's first event arrives: only the new run's end
		// may end the wait.
		actions = append([]chromedp.Action[chromedp.Void]{
			chromedp.Evaluate[chromedp.Void](`void delete document.getElementById("main").dataset.lessonDone`),
		}, actions...)
		actions = append(actions,
			waitVisible(fmt.Sprintf(`#main[data-lesson-done="%d"]`, n)),
			waitVisible(`#state[data-state="idle"]`))
		if err := chromedp.Do(lctx, actions...); err != nil {
			t.Fatalf("lesson %d did not finish in the browser: %v", n, err)
		}
		return read(t, browser)
	}

	expect := map[int]func(t *testing.T, p page){
		1: func(t *testing.T, p page) {
			sameKey(t, p, "order.create", 3)
			replayedAfterFirst(t, p)
			count(t, "orders on the order lane", len(unique(p.Orders)), 1)
			count(t, "charges", len(p.Charges), 0)
			count(t, "trace links without a trace URL", len(p.Traces), 0)
		},
		3: func(t *testing.T, p page) {
			if !hasStatus(p, 422) {
				t.Errorf("no 422 answer on the timeline: %+v", p.Answers)
			}
			count(t, "orders on the order lane", len(unique(p.Orders)), 1)
		},
		4: func(t *testing.T, p page) {
			// A 409 with Retry-After for the duplicate sent while the first
			// runs; on a machine so busy that the first had finished by
			// then, both duplicates are its result, replayed.
			var retry bool
			replays := 0
			for _, a := range p.Answers {
				retry = retry || (a.Status == http.StatusConflict && a.Retry)
				if a.Status == http.StatusOK && a.Replayed {
					replays++
				}
			}
			if !retry && replays < 2 {
				t.Errorf("no 409 with Retry-After on the timeline, nor two replays: %+v", p.Answers)
			}
			sameKey(t, p, "order.pay", 3)
			count(t, "charges", len(unique(chargeIDs(p))), 1)
			if retry {
				states(t, p, "PROCESSING", "SUCCEEDED")
			} else {
				states(t, p, "SUCCEEDED")
			}
			noStepNotes(t, p) // run with Run: nothing was stepped
		},
		5: func(t *testing.T, p page) {
			for _, op := range []string{"order.create", "order.pay", "order.cancel"} {
				sameKey(t, p, op, 1)
			}
			count(t, "SUCCEEDED records", countState(p, "SUCCEEDED"), 3)
		},
		6: func(t *testing.T, p page) {
			replayedAfterFirst(t, p)
			count(t, "charges", len(unique(chargeIDs(p))), 1)
			if !hasStatus(p, http.StatusConflict) {
				t.Errorf("no 409 invalid_transition on the timeline: %+v", p.Answers)
			}
		},
		7: func(t *testing.T, p page) {
			if !hasStatus(p, http.StatusServiceUnavailable) {
				t.Errorf("no 503 on the timeline: %+v", p.Answers)
			}
			count(t, "charges", len(unique(chargeIDs(p))), 1)
			// The retry resumes the intent and sends the charge again (2
			// requests, one absorbed), unless it came after Retry-After and
			// the sweeper had looked the charge up first: then its answer
			// is that result, replayed, and the charge saw 1 request.
			want, why := 2, "one absorbed"
			for _, a := range p.Answers {
				if a.Status == http.StatusOK && a.Replayed {
					want, why = 1, "the sweeper looked it up before the retry came"
				}
			}
			if last := p.Charges[len(p.Charges)-1]; last.Requests != want {
				t.Errorf("the charge shows %d requests, want %d (%s)", last.Requests, want, why)
			}
			maxToken(t, p, 2)
		},
		8: func(t *testing.T, p page) {
			var hungUp bool
			for _, a := range p.Answers {
				hungUp = hungUp || a.Status == 0
			}
			if !hungUp {
				t.Errorf("no request without an answer (the client that hung up): %+v", p.Answers)
			}
			states(t, p, "PROCESSING", "FAILED_RETRYABLE", "SUCCEEDED")
			maxToken(t, p, 2)
		},
		9: func(t *testing.T, p page) {
			commands, results := messages(p, "command"), messages(p, "result")
			count(t, "commands on the broker lane", len(commands), 2)
			count(t, "results on the broker lane", len(results), 2)
			if len(commands) == 2 && commands[0].Key != commands[1].Key {
				t.Errorf("the redelivered command has another key: %+v", commands)
			}
			if len(results) == 2 && (results[0].Status != http.StatusCreated || results[0].Replayed ||
				results[1].Status != http.StatusCreated || !results[1].Replayed) {
				t.Errorf("results = %+v, want 201 then 201 replayed", results)
			}
			count(t, "orders on the order lane", len(unique(p.Orders)), 1)
		},
		10: func(t *testing.T, p page) {
			count(t, "commands on the broker lane", len(messages(p, "command")), 2)
			var replayed, fresh int
			for _, r := range messages(p, "result") {
				if r.Status == http.StatusCreated && r.Replayed {
					replayed++
				} else if r.Status == http.StatusCreated {
					fresh++
				}
			}
			count(t, "results replaying an HTTP create", replayed, 1)
			count(t, "results of a create by message first", fresh, 1)
			// Over HTTP: R1 first (executed), then R2 after its message (replayed).
			if a := p.Answers; len(a) != 2 || a[0].Status != http.StatusCreated || a[0].Replayed ||
				a[1].Status != http.StatusCreated || !a[1].Replayed {
				t.Errorf("HTTP answers = %+v, want 201, then 201 replayed", a)
			}
			count(t, "orders on the order lane", len(unique(p.Orders)), 2)
		},
		11: func(t *testing.T, p page) {
			dead := messages(p, "dead_letter")
			count(t, "dead letters on the broker lane", len(dead), 1)
			if len(dead) == 1 && dead[0].Deliveries != 5 {
				t.Errorf("the dead letter shows %d deliveries, want COMMAND_MAX_DELIVER = 5", dead[0].Deliveries)
			}
			count(t, "operator replays", len(messages(p, "replay")), 1)
			results := messages(p, "result")
			count(t, "results", len(results), 1)
			if len(results) == 1 && results[0].Status != http.StatusOK {
				t.Errorf("the replay's result has Status %d, want 200", results[0].Status)
			}
			count(t, "charges", len(unique(chargeIDs(p))), 1)
			states(t, p, "FAILED_RETRYABLE", "SUCCEEDED")
		},
		12: func(t *testing.T, p page) {
			events := messages(p, "event")
			count(t, "events heard (three, and the republished copy)", len(events), 4)
			ids := map[string]bool{}
			for _, e := range events {
				ids[e.MsgID] = true
			}
			count(t, "distinct Nats-Msg-Ids", len(ids), 3)
			again := messages(p, "republish")
			if len(again) != 1 || !again[0].Duplicate {
				t.Errorf("republished = %+v, want one, dropped as a duplicate", again)
			}
		},
		13: func(t *testing.T, p page) {
			count(t, "tables", p.Tables, 2)
		},
		15: func(t *testing.T, p page) {
			count(t, "charts", p.Charts, 6)
		},
	}

	// The pitfalls: each sends its story to a naive service making one
	// mistake (its requests marked so), then to the service.
	pitfall := map[string]int{}
	for _, l := range lessons.All() {
		if l.Pitfall != "" {
			pitfall[l.Pitfall] = l.Number
		}
	}
	checkThenInsert := pitfall["check-then-insert"]
	expect[checkThenInsert] = func(t *testing.T, p page) {
		toNaive, toService := 0, 0
		for _, r := range p.Requests {
			switch r.Naive {
			case "check-then-insert":
				toNaive++
			case "":
				toService++
			}
		}
		count(t, "creates sent to the naive service", toNaive, 5)
		count(t, "creates sent to the service", toService, 5)
		count(t, "requests marked naive", p.NaiveBadges, 5)
		count(t, "orders on the order lane (5 naive, 1 the service's)", len(unique(p.Orders)), 6)
		keepScreenshot(t, browser, "1440x900-pitfall-check-then-insert.png")
	}
	expect[pitfall["new-channel-key-per-retry"]] = func(t *testing.T, p page) {
		count(t, "charges on the channel lane (2 for the naive service's one intent, 1 for the service's)", len(unique(chargeIDs(p))), 3)
		count(t, "requests marked naive (a create, two pays)", p.NaiveBadges, 3)
	}

	for _, l := range lessons.All() {
		t.Run(fmt.Sprintf("lesson %d: %s", l.Number, l.Title), func(t *testing.T) {
			var p page
			if l.Number == checkThenInsert {
				// Stepped from the keyboard: each burst of five goes with one n.
				var keys []chromedp.Action[chromedp.Void]
				for _, d := range strconv.Itoa(l.Number) {
					keys = append(keys, chromedp.KeyEvent(string(d)))
				}
				p = play(t, l.Number, append(keys, chromedp.KeyEvent("s"),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"),
					until(`document.querySelectorAll('#rows li[data-kind="ans"]').length >= 5`),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"))...)
				count(t, "steps still waiting once the lesson is done", p.Waits, 0)
				if stepNotes(p) == 0 {
					t.Errorf("stepped, no request says that its burst went with one step: %q", p.Says)
				}
			} else if l.Number == 2 {
				// Stepped from the keyboard: pick it, s, then n for each request.
				p = play(t, 2, chromedp.KeyEvent("2"), chromedp.KeyEvent("s"),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"),
					waitVisible(`#rows li[data-kind="ans"]`),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"))
				sameKey(t, p, "order.create", 1)
				count(t, "create requests", len(p.Requests), 2)
				count(t, "orders on the order lane", len(unique(p.Orders)), 2)
			} else if l.Number == 9 {
				// Stepped too: each command waits for n like a request.
				p = play(t, 9, chromedp.KeyEvent("9"), chromedp.KeyEvent("s"),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"),
					waitVisible(`#rows li[data-msg-kind="result"]`),
					waitVisible(`#rows li.wait`), chromedp.KeyEvent("n"))
				if n := len(p.Requests); n != 0 {
					t.Errorf("%d HTTP requests in a lesson of messages", n)
				}
				count(t, "steps still waiting once the lesson is done", p.Waits, 0)
			} else {
				p = play(t, l.Number)
			}
			passed(t, p)
			if p.Why != l.Why {
				t.Errorf("why = %q, want the lesson's %q", p.Why, l.Why)
			}
			if f := expect[l.Number]; f != nil {
				f(t, p)
			}
		})
	}

	t.Run("a request sent again with its key is replayed, with a new key it is a new order", func(t *testing.T) {
		p := play(t, 1)
		first := p.Requests[0].ID
		resend := func(newKey bool) (req int, key string) {
			t.Helper()
			button := map[bool]int{false: 1, true: 2}[newKey]
			before := countResends(p, first)
			if err := chromedp.Do(browser, click(
				fmt.Sprintf(`#rows li[data-kind="req"][data-request="%d"] .resend button:nth-child(%d)`, first, button))); err != nil {
				t.Fatalf("re-send: %v", err)
			}
			waitFor(t, browser, func(p page) bool { return countResends(p, first) == before+1 })
			p = read(t, browser)
			last := p.Requests[len(p.Requests)-1]
			waitAnswer(t, browser, last.ID)
			p = read(t, browser)
			return last.ID, last.Key
		}
		id, key := resend(false)
		if a := answerOf(p, id); a.Status != http.StatusCreated || !a.Replayed || key != p.Requests[0].Key {
			t.Errorf("the re-send with the same key got %+v, want 201 replayed", a)
		}
		id, key = resend(true)
		if a := answerOf(p, id); a.Status != http.StatusCreated || a.Replayed || key == p.Requests[0].Key {
			t.Errorf("the re-send with a new key got %+v (key %q), want 201 not replayed under a new key", a, key)
		}
		// The lab draws the answer first and the order it observed after it.
		waitFor(t, browser, func(p page) bool { return len(unique(p.Orders)) >= 2 })
		count(t, "orders on the order lane", len(unique(read(t, browser).Orders)), 2)
	})

	t.Run("run with Run, the burst lesson says nothing of step mode", func(t *testing.T) {
		p := play(t, checkThenInsert)
		passed(t, p)
		noStepNotes(t, p)
	})

	t.Run("lesson 14 sent again: a replay says it is the stored answer, a request without a key goes without one", func(t *testing.T) {
		p := play(t, 14)
		passed(t, p)
		var pay, keyless int
		for _, r := range p.Requests {
			if r.Op == "order.pay" && r.Key != "" && pay == 0 {
				pay = r.ID
			}
			if r.Key == "" && keyless == 0 {
				keyless = r.ID
			}
		}
		if pay == 0 || keyless == 0 {
			t.Fatalf("lesson 14 has no keyed pay (%d) or no request without a key (%d): %+v", pay, keyless, p.Requests)
		}
		buttons := func(id int) []string {
			return evaluate[[]string](t, browser, fmt.Sprintf(
				`[...document.querySelectorAll('#rows li[data-kind="req"][data-request="%d"] .resend button')].map((b) => b.textContent)`, id))
		}
		if got := buttons(pay); len(got) != 2 || !strings.Contains(got[0], "same key") || !strings.Contains(got[1], "new key") {
			t.Errorf("the pay's re-send buttons = %q, want same key and new key", got)
		}
		if got := buttons(keyless); len(got) != 1 || !strings.Contains(got[0], "send again") {
			t.Errorf("the re-send buttons of request %d, which carried no key = %q, want one: send again", keyless, got)
		}

		// The pay of a PAID order, sent again under its key: its first
		// answer, 202 PAYMENT_PENDING, replayed, and said to be that.
		resent := resendAndWait(t, browser, pay, 1)
		if want := keyOf(p, pay); resent.Key != want {
			t.Errorf("the pay went again under %q, want its own key %q", resent.Key, want)
		}
		if a := answerOf(read(t, browser), resent.ID); a.Status != http.StatusAccepted || !a.Replayed {
			t.Errorf("the pay sent again after PAID got %+v, want its first answer, 202, replayed", a)
		}
		if err := chromedp.Do(browser, until(fmt.Sprintf(
			`document.querySelector('#rows li[data-kind="ans"][data-request="%d"]').dataset.orderNow === "PAID"`, resent.ID))); err != nil {
			t.Fatal(err)
		}
		stored := evaluate[string](t, browser, fmt.Sprintf(`document.querySelector('#rows li[data-kind="ans"][data-request="%d"] .stored').textContent`, resent.ID))
		for _, want := range []string{"as stored", "PAYMENT_PENDING then", "PAID now"} {
			if !strings.Contains(stored, want) {
				t.Errorf("the replayed 202 says %q; want %q in it: it is the stored first answer, the order is PAID", stored, want)
			}
		}
		keepScreenshot(t, browser, "1440x900-lesson-14-pay-resent.png")
		lane := evaluate[[]string](t, browser, `[...document.querySelectorAll('#rows li[data-kind="ord"]')].map((li) => li.textContent)`)
		if len(lane) == 0 || !strings.Contains(lane[len(lane)-1], "PAID") || strings.Contains(lane[len(lane)-1], "PENDING") {
			t.Errorf("the order lane ends with %q, want the order as it is, PAID (not the replay's PAYMENT_PENDING)", lane)
		}

		// The forged webhook, which carried no key, goes again without one.
		again := resendAndWait(t, browser, keyless, 1)
		if again.Key != "" {
			t.Errorf("request %d carried no key, its re-send carries %q", keyless, again.Key)
		}
		if a := answerOf(read(t, browser), again.ID); a.Status == 0 {
			t.Errorf("the re-send without a key got no answer: %+v", a)
		}
	})

	t.Run("a request of the learner's own, twice under one key, is replayed", func(t *testing.T) {
		key := fmt.Sprintf("own-%d", time.Now().UnixNano()) // the run's own: -count=2 reuses the database
		send := func(want string) {
			t.Helper()
			if err := chromedp.Do(browser,
				setValue("#own-op", "create"),
				setValue("#own-key", key),
				click(`#own button[type="submit"]`),
				waitVisible(want)); err != nil {
				t.Fatalf("own request: %v", err)
			}
		}
		send(`#own-status[data-status="201"][data-replayed="false"]`)
		send(`#own-status[data-status="201"][data-replayed="true"]`)
		p := read(t, browser)
		sameKey(t, p, "order.create", 2)
	})

	t.Run("a lesson's number typed picks it, two digits included", func(t *testing.T) {
		for _, keys := range []string{"14", "9", "10"} {
			for _, k := range keys {
				if err := chromedp.Do(browser, chromedp.KeyEvent(string(k))); err != nil {
					t.Fatalf("typing %s: %v", keys, err)
				}
			}
			if err := chromedp.Do(browser, waitVisible(fmt.Sprintf(`#lessons button[data-lesson="%s"][aria-current="true"]`, keys))); err != nil {
				t.Fatalf("after typing %s: %v", keys, err)
			}
			time.Sleep(time.Second) // the next number starts afresh
		}
	})

	t.Run("fault toggles set the channel's real faults", func(t *testing.T) {
		if err := chromedp.Do(browser,
			setValue("#unavail", "100"),
			click(`#faults button[type="submit"]`),
			waitVisible(`#faults-status[data-on="true"]`)); err != nil {
			t.Fatal(err)
		}
		if f := channelFaults(t, channelURL); f["unavailable_rate"] != 1 {
			t.Errorf("channel faults after Apply = %v, want unavailable_rate 1", f)
		}
		if err := chromedp.Do(browser, click("#faults-clear"),
			waitVisible(`#faults-status[data-on="false"]`)); err != nil {
			t.Fatal(err)
		}
		if f := channelFaults(t, channelURL); f["unavailable_rate"] != 0 {
			t.Errorf("channel faults after Clear = %v, want none", f)
		}
	})

	t.Run("the screenshot for the README", func(t *testing.T) {
		p := play(t, 7)
		passed(t, p)
		// The whole timeline, not its scrolled tail: the picture tells the
		// story. The page, made to fit the window, is laid out as one long
		// page for it (the "whole" class), then back.
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](
			`(() => { document.getElementById("own").reset(); document.documentElement.classList.add("whole"); return true })()`)); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](`document.documentElement.classList.remove("whole") || true`)); err != nil {
			t.Fatal(err)
		}
		// The README's copy changes only when asked (make lab-screenshot), so
		// a test run leaves the work tree as it found it.
		out := filepath.Join(screenshots(t), "lab.png")
		if os.Getenv("LAB_SCREENSHOT") == "update" {
			out = filepath.FromSlash(screenshot)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s (%d bytes)", out, len(png))
	})

	// The page as a learner meets it, at the sizes of a laptop and of a
	// desktop: each from a fresh load, as a new learner opens it.
	for _, size := range [][2]int{{1280, 720}, {1920, 1080}} {
		w, h := size[0], size[1]
		t.Run(fmt.Sprintf("at %d×%d every control is in reach without scrolling the page", w, h), func(t *testing.T) {
			viewport(t, browser, w, h)
			if err := chromedp.Do(browser,
				chromedp.Navigate("http://"+srv.addr+"/"),
				waitVisible(`#lessons button[data-lesson="10"]`),
				waitVisible(`#live[data-live="true"]`),
			); err != nil {
				t.Fatalf("the lab's page did not load at %d×%d: %v", w, h, err)
			}
			keepScreenshot(t, browser, fmt.Sprintf("%dx%d.png", w, h))
			r := evaluate[reach](t, browser, reachControls)
			if r.ScrollHeight > r.InnerHeight || r.ScrollWidth > r.InnerWidth {
				t.Errorf("the page scrolls: %d×%d of content in a %d×%d window", r.ScrollWidth, r.ScrollHeight, r.InnerWidth, r.InnerHeight)
			}
			lessonsSeen := 0
			for _, c := range r.Controls {
				switch {
				case c.How == "in sight":
				case runControls[c.Name] || c.How == "missing" || c.How == "out of reach":
					// The run controls stay in sight at the sidebar's top; the
					// others may sit in an element that scrolls on its own.
					t.Errorf("%s is %s at %d×%d", c.Name, c.How, w, h)
				default:
					t.Logf("%s: %s", c.Name, c.How)
				}
				if strings.HasPrefix(c.Name, "lesson ") {
					lessonsSeen++
				}
			}
			count(t, "lessons in the list", lessonsSeen, len(lessons.All()))
		})
	}

	t.Run("at 1280×720 the timeline reads from the top, follows only from its end, and shows a re-send", func(t *testing.T) {
		viewport(t, browser, 1280, 720)
		// Stepped, so that each part is seen at its moment; should a check
		// stop it half-way, the rest is run so the next subtest finds the
		// lab idle.
		t.Cleanup(func() {
			_ = chromedp.Do(browser, chromedp.Evaluate[chromedp.Void](`void document.getElementById("rest").click()`), waitVisible(`#state[data-state="idle"]`))
		})
		if err := chromedp.Do(browser, chromedp.KeyEvent("7"), chromedp.KeyEvent("s"), waitVisible(`#rows li.wait`)); err != nil {
			t.Fatalf("lesson 7, stepped: %v", err)
		}
		if s := readStory(t, browser); s.Top != 0 {
			t.Errorf("the first rows arrived with the timeline scrolled to %d, want 0 (its top)", s.Top)
		}
		for i := 1; i <= 2; i++ {
			if err := chromedp.Do(browser, chromedp.KeyEvent("n"), until(fmt.Sprintf(
				`document.querySelectorAll('#rows li[data-kind="ans"]').length >= %d && !!document.querySelector("#rows li.wait")`, i))); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		s := readStory(t, browser)
		if s.Height <= s.Client {
			t.Fatalf("after two steps the timeline (%d px) still fits its %d px: the checks below say nothing", s.Height, s.Client)
		}
		if s.Top != 0 || !s.Jump {
			t.Errorf("the learner did not scroll: the timeline is at %d (want 0, its top), the jump to new rows shown: %v (want true)", s.Top, s.Jump)
		}
		if covered := evaluate[[]string](t, browser, underJump); len(covered) > 0 {
			t.Errorf("the jump button covers rows of the timeline: %q", covered)
		}
		keepScreenshot(t, browser, "1280x720-lesson-7-jump.png")
		// A row brought into view by the browser (a re-send button focused
		// from the keyboard) lands below the sticky lane headers, not under them.
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](`(() => {
  const s = document.getElementById("story"), li = document.querySelectorAll('#rows li[data-kind="req"]')[0];
  s.scrollTop += li.getBoundingClientRect().top - document.querySelector(".lanes").getBoundingClientRect().top - 2;
  li.querySelector(".resend button").focus();
  return true })()`)); err != nil {
			t.Fatal(err)
		}
		if !evaluate[bool](t, browser, `(() => { const li = document.querySelectorAll('#rows li[data-kind="req"]')[0];
  return li.getBoundingClientRect().top >= document.querySelector(".lanes").getBoundingClientRect().bottom - 0.5 })()`) {
			t.Errorf("a row whose re-send button was focused stays under the sticky lane headers: %+v", readStory(t, browser))
		}
		keepScreenshot(t, browser, "1280x720-lesson-7-focused.png")
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](`(() => { document.activeElement.blur(); document.getElementById("story").scrollTop = 0; return true })()`)); err != nil {
			t.Fatal(err)
		}
		// The learner scrolls to the end, then runs the rest: it follows.
		if err := chromedp.Do(browser,
			chromedp.Evaluate[chromedp.Void](`void (document.getElementById("story").scrollTop = 1e9)`),
			until(`document.getElementById("jump").hidden`),
			chromedp.KeyEvent("c"),
			waitVisible(`#main[data-lesson-done="7"]`),
			waitVisible(`#state[data-state="idle"]`),
		); err != nil {
			t.Fatalf("the rest of lesson 7: %v", err)
		}
		passed(t, read(t, browser))
		if s := readStory(t, browser); s.Height-s.Client-s.Top > 4 {
			t.Errorf("the learner was at the end, but the timeline stayed at %d of %d (%d px shown): it did not follow", s.Top, s.Height, s.Client)
		}
		keepScreenshot(t, browser, "1280x720-lesson-7-followed.png")

		// The learner goes back to the top and sends the first request again:
		// its rows land at the end, and are brought into view.
		if err := chromedp.Do(browser,
			chromedp.Evaluate[chromedp.Void](`void (document.getElementById("story").scrollTop = 0)`),
			until(`document.getElementById("story").scrollTop === 0`),
		); err != nil {
			t.Fatal(err)
		}
		p := read(t, browser)
		first := p.Requests[0].ID
		before := countResends(p, first)
		if err := chromedp.Do(browser, click(
			fmt.Sprintf(`#rows li[data-kind="req"][data-request="%d"] .resend button:nth-child(1)`, first))); err != nil {
			t.Fatalf("re-send: %v", err)
		}
		waitFor(t, browser, func(p page) bool { return countResends(p, first) == before+1 })
		p = read(t, browser)
		id := p.Requests[len(p.Requests)-1].ID
		waitAnswer(t, browser, id)
		for _, sel := range []string{
			fmt.Sprintf(`#rows li[data-kind="req"][data-request="%d"]`, id),
			fmt.Sprintf(`#rows li[data-kind="ans"][data-request="%d"]`, id),
		} {
			if !evaluate[bool](t, browser, fmt.Sprintf(rowInSight, sel)) {
				t.Errorf("after the re-send, %s is out of sight: %+v", sel, readStory(t, browser))
			}
		}
		keepScreenshot(t, browser, "1280x720-lesson-7-resend.png")
	})

	t.Run("at 1024 px the lanes stay legible", func(t *testing.T) {
		viewport(t, browser, 1024, 768)
		passed(t, play(t, 7))
		l := evaluate[lanes](t, browser, readLanes)
		if len(l.Heads) != 7 {
			t.Fatalf("%d lane headers, want 7", len(l.Heads))
		}
		for i, h := range l.Heads {
			if h.Cell.Right <= h.Cell.Left || h.Text.Right <= h.Text.Left {
				t.Fatalf("the lane header %q has no box: %+v", h.Name, h)
			}
			if h.Text.Left < h.Cell.Left-0.5 || h.Text.Right > h.Cell.Right+0.5 {
				t.Errorf("the lane header %q (%.0f–%.0f) spills out of its lane (%.0f–%.0f)", h.Name, h.Text.Left, h.Text.Right, h.Cell.Left, h.Cell.Right)
			}
			if i > 0 && h.Cell.Left < l.Heads[i-1].Cell.Right-0.5 {
				t.Errorf("the lane headers %q and %q overlap", l.Heads[i-1].Name, h.Name)
			}
		}
		failed := 0
		for _, w := range l.Words {
			if w.Word == "FAILED_RETRYABLE" {
				failed++
			}
			if w.Lines != 1 || !w.Inside {
				t.Errorf("%s is broken across %d lines or out of its box (inside: %v)", w.Word, w.Lines, w.Inside)
			}
		}
		if failed == 0 {
			t.Errorf("no FAILED_RETRYABLE on lesson 7's record lane to check: %+v", l.Words)
		}
		if l.Sideways {
			t.Errorf("the timeline needs scrolling sideways at 1024 px (or would, with a scrollbar that takes space)")
		}
		// The picture shows the record lane's FAILED_RETRYABLE.
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](`(() => {
  const s = document.getElementById("story"), r = document.querySelector('#rows li[data-state="FAILED_RETRYABLE"]');
  s.scrollTop += r.getBoundingClientRect().top - s.getBoundingClientRect().top - s.clientHeight / 3;
  return true })()`)); err != nil {
			t.Fatal(err)
		}
		keepScreenshot(t, browser, "1024x768-lesson-7.png")
	})
	// Last, for it loads another lab in the browser.
	t.Run("with a trace URL every request links to its own trace", func(t *testing.T) {
		traced, err := start(ctx, config{listen: "127.0.0.1:0", Config: lessons.Config{
			BaseURL: m.URL(), ChannelURL: channelURL, APIKey: apptest.KeyAcme, Observe: true, Tenant: "acme", NATSURL: m.NATSURL,
			TraceURL: "http://traces.example.test/trace/{trace_id}"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = traced.close(context.Background()) })
		if err := chromedp.Do(browser, chromedp.Navigate("http://"+traced.addr+"/"),
			waitVisible(`#lessons button[data-lesson="1"]`), waitVisible(`#live[data-live="true"]`)); err != nil {
			t.Fatal(err)
		}
		p := play(t, 1)
		passed(t, p)
		count(t, "trace links", len(p.Traces), len(p.Requests))
		ids := map[string]bool{}
		for _, tr := range p.Traces {
			if len(tr.TraceID) != 32 || strings.Trim(tr.TraceID, "0123456789abcdef") != "" || tr.Href != "http://traces.example.test/trace/"+tr.TraceID {
				t.Errorf("trace link %q for trace id %q, want the template with a 32-hex trace id", tr.Href, tr.TraceID)
			}
			ids[tr.TraceID] = true
		}
		count(t, "distinct traces", len(ids), len(p.Traces))
		keepScreenshot(t, browser, "1440x900-trace-links.png")
	})
	t.Logf("the browser test took %s", time.Since(began).Round(100*time.Millisecond))
}

// stepNote is how a note begins that says a step let a request go at
// once; only a stepped run may show one.
const stepNote = "step mode sends #"

func stepNotes(p page) int {
	n := 0
	for _, s := range p.Says {
		if strings.Contains(s, stepNote) {
			n++
		}
	}
	return n
}

func noStepNotes(t *testing.T, p page) {
	t.Helper()
	for _, s := range p.Says {
		if strings.Contains(s, stepNote) {
			t.Errorf("a lesson run with Run says %q: only a stepped run may", s)
		}
	}
}

// resendAndWait clicks re-send button n (1: same key or send again, 2: new
// key) of request id, and returns the request it sent once answered.
func resendAndWait(t *testing.T, browser context.Context, id, n int) (req struct {
	ID     int    `json:"id"`
	Key    string `json:"key"`
	Op     string `json:"op"`
	Resend int    `json:"resend"`
	Naive  string `json:"naive"`
}) {
	t.Helper()
	before := countResends(read(t, browser), id)
	if err := chromedp.Do(browser, click(
		fmt.Sprintf(`#rows li[data-kind="req"][data-request="%d"] .resend button:nth-child(%d)`, id, n))); err != nil {
		t.Fatalf("re-send of #%d: %v", id, err)
	}
	waitFor(t, browser, func(p page) bool { return countResends(p, id) == before+1 })
	p := read(t, browser)
	for _, r := range p.Requests {
		if r.Resend == id {
			req = r
		}
	}
	waitAnswer(t, browser, req.ID)
	return req
}

func keyOf(p page, id int) string {
	for _, r := range p.Requests {
		if r.ID == id {
			return r.Key
		}
	}
	return ""
}

// underJump lists the timeline's rows whose visible part lies under the
// jump button ("↓ new rows below"), when it is shown.
const underJump = `(() => {
  const jump = document.getElementById("jump");
  if (jump.hidden) return [];
  const j = jump.getBoundingClientRect(), s = document.getElementById("story").getBoundingClientRect();
  return [...document.querySelectorAll("#rows > li")].filter((li) => {
    const r = li.getBoundingClientRect(), top = Math.max(r.top, s.top), bottom = Math.min(r.bottom, s.bottom);
    return bottom > top && top < j.bottom && bottom > j.top && r.left < j.right && r.right > j.left;
  }).map((li) => li.textContent.slice(0, 60));
})()`

// runControls are the controls that must be in sight at once, whatever the
// window: the first a learner looks for.
var runControls = map[string]bool{"Run": true, "Step": true, "Next request": true, "Run the rest": true, "Run all": true}

// reach is what reachControls finds: the document's size against the
// window's, and how each control can be reached.
type reach struct {
	ScrollHeight int `json:"scrollHeight"`
	ScrollWidth  int `json:"scrollWidth"`
	InnerHeight  int `json:"innerHeight"`
	InnerWidth   int `json:"innerWidth"`
	Controls     []struct {
		Name string `json:"name"`
		How  string `json:"how"` // "in sight", "in sight after scrolling …", "out of reach", "missing"
	} `json:"controls"`
}

// reachControls finds, for each control, whether it is in sight (its box
// inside the window and inside every box that clips it, and what a click
// at its centre hits), or else whether it becomes so when the element that
// scrolls it on its own (the lesson list, the sidebar) is scrolled, the
// page staying put.
const reachControls = `(() => {
  const controls = [
    ["Run", "#run"], ["Step", "#step"], ["Next request", "#next"], ["Run the rest", "#rest"], ["Run all", "#all"],
    ["lost responses", "#lost"], ["503 answers", "#unavail"], ["latency", "#latency"],
    ["Apply", '#faults button[type="submit"]'], ["Clear", "#faults-clear"],
    ["operation", "#own-op"], ["order", "#own-order"], ["payment method", "#own-method"], ["Idempotency-Key", "#own-key"],
    ["Send", '#own button[type="submit"]'],
    ...[...document.querySelectorAll("#lessons button")].map((b) => ["lesson " + b.dataset.lesson, '#lessons button[data-lesson="' + b.dataset.lesson + '"]']),
  ];
  const inside = (r, b) => r.width > 0 && r.height > 0 &&
    r.left >= b.left - 0.5 && r.top >= b.top - 0.5 && r.right <= b.right + 0.5 && r.bottom <= b.bottom + 0.5;
  const view = { left: 0, top: 0, right: innerWidth, bottom: innerHeight };
  const clippers = (el) => {
    const out = [];
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (s.overflowX !== "visible" || s.overflowY !== "visible") out.push(p);
    }
    return out;
  };
  const inSight = (el) => {
    const r = el.getBoundingClientRect();
    if (!inside(r, view)) return false;
    for (const p of clippers(el)) {
      const c = p.getBoundingClientRect();
      const left = c.left + p.clientLeft, top = c.top + p.clientTop;
      if (!inside(r, { left, top, right: left + p.clientWidth, bottom: top + p.clientHeight })) return false;
    }
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return !!hit && el.contains(hit);
  };
  const doc = document.scrollingElement;
  const out = { scrollHeight: doc.scrollHeight, scrollWidth: doc.scrollWidth, innerHeight, innerWidth, controls: [] };
  for (const [name, sel] of controls) {
    const el = document.querySelector(sel);
    if (!el) { out.controls.push({ name, how: "missing" }); continue; }
    if (inSight(el)) { out.controls.push({ name, how: "in sight" }); continue; }
    const s = clippers(el).find((p) => /auto|scroll/.test(getComputedStyle(p).overflowY) && p.scrollHeight > p.clientHeight);
    if (!s || !inSight(s)) { out.controls.push({ name, how: "out of reach" }); continue; }
    const was = s.scrollTop;
    s.scrollTop += el.getBoundingClientRect().top - s.getBoundingClientRect().top - (s.clientHeight - el.offsetHeight) / 2;
    const ok = inSight(el) && doc.scrollTop === 0 && doc.scrollLeft === 0;
    out.controls.push({ name, how: ok ? "in sight after scrolling #" + (s.id || s.className) + " on its own" : "out of reach" });
    s.scrollTop = was;
  }
  return out;
})()`

// story is where the timeline's scroller (#story: the timeline, then the
// lesson's checks) stands.
type story struct {
	Top    int  `json:"top"`
	Height int  `json:"height"`
	Client int  `json:"client"`
	Jump   bool `json:"jump"` // the "↓ new rows below" button is shown
}

func readStory(t *testing.T, browser context.Context) story {
	t.Helper()
	return evaluate[story](t, browser, `(() => { const s = document.getElementById("story");
  return { top: Math.round(s.scrollTop), height: s.scrollHeight, client: s.clientHeight, jump: !document.getElementById("jump").hidden } })()`)
}

// rowInSight (with a row's selector) holds when the row lies inside the
// timeline's visible part, below its lane headers, and inside the window.
const rowInSight = `(() => {
  const li = document.querySelector(%q), s = document.getElementById("story");
  if (!li) return false;
  const r = li.getBoundingClientRect(), b = s.getBoundingClientRect();
  const top = Math.max(b.top + s.clientTop, document.querySelector(".lanes").getBoundingClientRect().bottom);
  return r.height > 0 && r.top >= top - 0.5 && r.bottom <= b.top + s.clientTop + s.clientHeight + 0.5 &&
    r.top >= 0 && r.bottom <= innerHeight;
})()`

type rect struct {
	Left  float64 `json:"left"`
	Right float64 `json:"right"`
}

// lanes is what readLanes finds: each lane header's box and its text's,
// each state name on the timeline (on how many lines, inside its pill or
// not), and whether the timeline needs scrolling sideways.
type lanes struct {
	Heads []struct {
		Name string `json:"name"`
		Cell rect   `json:"cell"`
		Text rect   `json:"text"`
	} `json:"heads"`
	Words []struct {
		Word   string `json:"word"`
		Lines  int    `json:"lines"`
		Inside bool   `json:"inside"`
	} `json:"words"`
	Sideways bool `json:"sideways"`
}

const readLanes = `(() => {
  const x = (r) => ({ left: r.left, right: r.right }); // a DOMRect is not sent by value
  const text = (el) => { const r = document.createRange(); r.selectNodeContents(el); return x(r.getBoundingClientRect()); };
  const heads = [...document.querySelectorAll(".lanes > div")].map((d) => ({ name: d.textContent.trim(), cell: x(d.getBoundingClientRect()), text: text(d) }));
  const words = [];
  for (const pill of document.querySelectorAll("#rows .pill")) {
    const p = pill.getBoundingClientRect();
    const walk = document.createTreeWalker(pill, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(/\b[A-Z]{4,}(?:_[A-Z]+)*\b/g)) {
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        const w = r.getBoundingClientRect();
        words.push({ word: m[0], lines: [...r.getClientRects()].filter((x) => x.width > 0).length,
          inside: w.left >= p.left - 0.5 && w.right <= p.right + 0.5 });
      }
    }
  }
  // Sideways: the story scrolls so, or would with a scrollbar that takes
  // space (15 px; headless Chromium's take none).
  const s = document.getElementById("story"), least = parseFloat(getComputedStyle(document.querySelector(".timeline")).minWidth) || 0;
  return { heads, words, sideways: s.scrollWidth > s.clientWidth || least + 15 > s.clientWidth };
})()`

// viewport sets the window's size for a subtest, and puts back the
// 1440×900 the others run at.
func viewport(t *testing.T, browser context.Context, w, h int) {
	t.Helper()
	if err := chromedp.Do(browser, chromedp.EmulateViewport(int64(w), int64(h))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = chromedp.Do(browser, chromedp.EmulateViewport(1440, 900)) })
}

// screenshots is where the test keeps its screenshots for a person to look
// at ($TMPDIR/orderservice-lab-screenshots: t.TempDir would delete them).
func screenshots(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "orderservice-lab-screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// keepScreenshot writes what the window shows to the screenshots' folder.
func keepScreenshot(t *testing.T, browser context.Context, name string) {
	t.Helper()
	// Two frames, so that a scroll just made is painted.
	if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](
		`new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(() => ok(true))))`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(browser, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(screenshots(t), name)
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s", out)
}

func evaluate[T any](t *testing.T, browser context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(browser, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate in the page: %v", err)
	}
	return v
}

func read(t *testing.T, browser context.Context) page {
	t.Helper()
	p, err := chromedp.Run(browser, chromedp.Evaluate[page](readPage))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	return p
}

// waitFor polls the page until ok holds, for state the DOM reaches
// asynchronously (an answer drawn after its request).
func waitFor(t *testing.T, browser context.Context, ok func(page) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ok(read(t, browser)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never reached the expected state: %+v", read(t, browser))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitAnswer(t *testing.T, browser context.Context, request int) {
	t.Helper()
	waitFor(t, browser, func(p page) bool { return answerOf(p, request).Request == request })
}

func answerOf(p page, request int) (a struct {
	Request  int  `json:"request"`
	Status   int  `json:"status"`
	Replayed bool `json:"replayed"`
	Retry    bool `json:"retry"`
}) {
	for _, x := range p.Answers {
		if x.Request == request {
			return x
		}
	}
	return a
}

func countResends(p page, of int) int {
	n := 0
	for _, r := range p.Requests {
		if r.Resend == of {
			n++
		}
	}
	return n
}

func passed(t *testing.T, p page) {
	t.Helper()
	if p.Status != "passed" || len(p.Checks) == 0 {
		t.Errorf("the lesson shows status %q with %d checks, want passed", p.Status, len(p.Checks))
	}
	for _, c := range p.Checks {
		if !c.OK {
			t.Errorf("red check: %s", c.Text)
		}
	}
}

// sameKey asserts that op's requests on the timeline, want of them, all
// carry one key.
func sameKey(t *testing.T, p page, op string, want int) {
	t.Helper()
	keys := map[string]int{}
	for _, r := range p.Requests {
		if r.Op == op {
			keys[r.Key]++
		}
	}
	found := false
	for _, n := range keys {
		found = found || n == want
	}
	if !found {
		t.Errorf("want %d %s requests under one key on the timeline, got keys %v", want, op, keys)
	}
}

// replayedAfterFirst asserts that the first answer to a key executed and
// a later one under the same key was replayed.
func replayedAfterFirst(t *testing.T, p page) {
	t.Helper()
	byID := map[int]string{}
	for _, r := range p.Requests {
		byID[r.ID] = r.Key
	}
	first := map[string]bool{}
	for _, a := range p.Answers {
		key := byID[a.Request]
		if key == "" || a.Status/100 != 2 {
			continue
		}
		if !first[key] {
			if a.Replayed {
				t.Errorf("the first answer under %s is marked replayed", key)
			}
			first[key] = true
			continue
		}
		if a.Replayed {
			return
		}
	}
	t.Errorf("no answer marked replayed after a first one under the same key: %+v", p.Answers)
}

// messages are the broker lane's rows of one kind.
func messages(p page, kind string) (out []brokerRow) {
	for _, m := range p.Messages {
		if m.Kind == kind {
			out = append(out, m)
		}
	}
	return out
}

func hasStatus(p page, status int) bool {
	for _, a := range p.Answers {
		if a.Status == status {
			return true
		}
	}
	return false
}

func states(t *testing.T, p page, want ...string) {
	t.Helper()
	for _, s := range want {
		if countState(p, s) == 0 {
			t.Errorf("the record lane never shows %s: %+v", s, p.Records)
		}
	}
}

func countState(p page, state string) int {
	n := 0
	for _, r := range p.Records {
		if r.State == state {
			n++
		}
	}
	return n
}

func maxToken(t *testing.T, p page, want int) {
	t.Helper()
	top := 0
	for _, r := range p.Records {
		top = max(top, r.Token)
	}
	if top != want {
		t.Errorf("the highest lease_token on the record lane is %d, want %d", top, want)
	}
}

func chargeIDs(p page) []string {
	var ids []string
	for _, c := range p.Charges {
		ids = append(ids, c.ID)
	}
	return ids
}

func unique(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func count(t *testing.T, what string, got, want int) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %d, want %d", what, got, want)
	}
}

func channelFaults(t *testing.T, channelURL string) map[string]float64 {
	t.Helper()
	res, err := http.Get(channelURL + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var f map[string]float64
	if err := json.NewDecoder(res.Body).Decode(&f); err != nil {
		t.Fatal(err)
	}
	return f
}

// CSS selectors for the page's elements.
func waitVisible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}
func click(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }

// until waits for a JavaScript condition to hold in the page.
func until(cond string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](cond) }
func setValue(sel, v string) chromedp.Action[chromedp.Void] {
	return chromedp.SetValue(chromedp.CSS(sel), v)
}
