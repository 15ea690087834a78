package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/lessons"
	"github.com/orderservice/orderservice/internal/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "lab"))
}

// screenshot is where the README's picture of the lab is written.
const screenshot = "../../docs/lab.png"

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
	} `json:"requests"`
	Answers []struct {
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
	Tables   int         `json:"tables"`
	Charts   int         `json:"charts"`
	Waits    int         `json:"waits"`
}

const readPage = `(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  const b = document.querySelector('#lessons button[aria-current="true"]');
  return {
    status: b ? b.dataset.status : "",
    checks: q("#checks li").map((li) => ({ ok: li.dataset.ok === "true", text: li.textContent })),
    why: document.getElementById("why").textContent,
    requests: q('#rows li[data-kind="req"]').map((li) => ({ id: +li.dataset.request, key: li.dataset.key, op: li.dataset.operation, resend: +li.dataset.resend })),
    answers: q('#rows li[data-kind="ans"]').map((li) => ({ request: +li.dataset.request, status: +li.dataset.status,
      replayed: li.dataset.replayed === "true", retry: !!li.querySelector(".badge.retry") })),
    records: q('#rows li[data-kind="rec"]').map((li) => ({ state: li.dataset.state, token: +li.dataset.leaseToken })),
    charges: q('#rows li[data-kind="chg"]').map((li) => ({ id: li.dataset.charge, requests: +li.dataset.requests })),
    messages: q('#rows li[data-kind="msg"]').map((li) => ({ kind: li.dataset.msgKind, subject: li.dataset.subject, key: li.dataset.key,
      status: +li.dataset.status, replayed: li.dataset.replayed === "true", duplicate: li.dataset.duplicate === "true",
      msgId: li.dataset.msgId, deliveries: +li.dataset.deliveries })),
    orders: q('#rows li[data-kind="ord"]').map((li) => li.dataset.order),
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
	// pm_slow must outlast the moment lesson 4 sends its duplicate, and
	// stay below the test service's 2s channel timeout.
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_SLOW_DELAY": "1s"})
	channelURL := "http://" + m.ChannelAddr
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	srv, err := start(ctx, config{listen: "127.0.0.1:0", Config: lessons.Config{
		BaseURL: m.URL(), ChannelURL: channelURL, APIKey: apptest.KeyAcme, SweepWait: 15 * time.Second, Observe: true,
		Tenant: "acme", NATSURL: m.NATSURL, NATSOperator: "orderservice:" + m.Config.NATSServicePassword}})
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

	// play runs lesson n from the page (by keyboard when stepping) and
	// returns what the page shows once it is done.
	play := func(t *testing.T, n int, actions ...chromedp.Action[chromedp.Void]) page {
		t.Helper()
		lctx, cancel := context.WithTimeout(browser, time.Minute)
		defer cancel()
		if len(actions) == 0 {
			actions = []chromedp.Action[chromedp.Void]{click(fmt.Sprintf(`#lessons button[data-lesson="%d"]`, n))}
		}
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
		},
		3: func(t *testing.T, p page) {
			if !hasStatus(p, 422) {
				t.Errorf("no 422 answer on the timeline: %+v", p.Answers)
			}
			count(t, "orders on the order lane", len(unique(p.Orders)), 1)
		},
		4: func(t *testing.T, p page) {
			var retry bool
			for _, a := range p.Answers {
				retry = retry || (a.Status == http.StatusConflict && a.Retry)
			}
			if !retry {
				t.Errorf("no 409 with Retry-After on the timeline: %+v", p.Answers)
			}
			sameKey(t, p, "order.pay", 3)
			count(t, "charges", len(unique(chargeIDs(p))), 1)
			states(t, p, "PROCESSING", "SUCCEEDED")
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
			if last := p.Charges[len(p.Charges)-1]; last.Requests != 2 {
				t.Errorf("the charge shows %d requests, want 2 (one absorbed)", last.Requests)
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

	for _, l := range lessons.All() {
		t.Run(fmt.Sprintf("lesson %d: %s", l.Number, l.Title), func(t *testing.T) {
			var p page
			if l.Number == 2 {
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

	t.Run("a request of the learner's own, twice under one key, is replayed", func(t *testing.T) {
		send := func(want string) {
			t.Helper()
			if err := chromedp.Do(browser,
				setValue("#own-op", "create"),
				setValue("#own-key", "own-K1"),
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
		// The whole timeline, not its scrolled tail: the picture tells the story.
		if _, err := chromedp.Run(browser, chromedp.Evaluate[bool](
			`(() => { document.getElementById("own").reset(); const r = document.getElementById("rows"); r.style.maxHeight = "none"; r.scrollTop = 0; return true })()`)); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		// The README's copy changes only when asked (make lab-screenshot), so
		// a test run leaves the work tree as it found it.
		out := filepath.Join(t.TempDir(), "lab.png")
		if os.Getenv("LAB_SCREENSHOT") == "update" {
			out = filepath.FromSlash(screenshot)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s (%d bytes)", out, len(png))
	})
	t.Logf("the browser test took %s", time.Since(began).Round(100*time.Millisecond))
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
func setValue(sel, v string) chromedp.Action[chromedp.Void] {
	return chromedp.SetValue(chromedp.CSS(sel), v)
}
