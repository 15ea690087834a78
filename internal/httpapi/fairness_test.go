package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// tenantsHandler holds each request's slot until the test lets a request
// of its tenant go: entered says which tenant's request got a slot,
// release[tenant] lets one of that tenant's go.
type tenantsHandler struct {
	entered chan string
	release map[string]chan struct{}
}

func newTenantsHandler(tenants ...string) *tenantsHandler {
	h := &tenantsHandler{entered: make(chan string, 64), release: map[string]chan struct{}{}}
	for _, t := range tenants {
		h.release[t] = make(chan struct{}, 64)
	}
	return h
}

func (h *tenantsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Test-Tenant")
	h.entered <- tenant
	<-h.release[tenant]
	w.WriteHeader(http.StatusOK)
}

// fairKeys are the API keys of the tenants of the fairness tests.
var fairKeys = map[string]string{"acme": "key-acme-0123", "globex": "key-globex-0123"}

// guarded is a Server's Guard around h, with admission a and the tenants
// of fairKeys.
func guarded(a *httpapi.Admission, h http.Handler) http.Handler {
	return (&httpapi.Server{Tenants: httpapi.NewTenants(fairKeys), Admission: a}).Guard(h)
}

// sendAs sends a create as tenant to h in the background; its status
// arrives on the channel returned.
func sendAs(h http.Handler, tenant string) chan int {
	out := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", nil)
		req.Header.Set("Authorization", "Bearer "+fairKeys[tenant])
		req.Header.Set("X-Test-Tenant", tenant)
		h.ServeHTTP(rec, req)
		out <- rec.Code
	}()
	return out
}

// queuedWithin reports whether answer is still unanswered after d: the
// request waits in its queue.
func queuedWithin(answer chan int, d time.Duration) (int, bool) {
	select {
	case code := <-answer:
		return code, false
	case <-time.After(d):
		return 0, true
	}
}

// A tenant within its share is never refused because another exceeds its
// own: with acme holding every slot and its queue standing (its arrivals
// shed), globex's requests are queued, and each slot acme gives back goes
// to globex first, until globex holds its share. Four slots, QueueTimeout
// 2s (target 200ms, interval 400ms).
func TestATenantWithinItsShareIsServedWhileAnotherFloods(t *testing.T) {
	h := newTenantsHandler("acme", "globex")
	g := guarded(httpapi.NewAdmission(4, 100, 2*time.Second, nil), h)
	var acme []chan int
	for range 4 {
		acme = append(acme, sendAs(g, "acme"))
		<-h.entered
	}
	// acme's queue stands: its waiters wait past the target for an
	// interval. Three queue; each released holder's slot goes to one, 300ms
	// after the last.
	waiting := []chan int{sendAs(g, "acme"), sendAs(g, "acme"), sendAs(g, "acme")}
	for range 3 {
		hold := 300 * time.Millisecond
		time.Sleep(hold)
		h.release["acme"] <- struct{}{}
		if got := <-h.entered; got != "acme" {
			t.Fatalf("a slot went to %s, want acme's waiter", got)
		}
	}
	shed := 0
	for range 8 { // acme floods: what finds its queue full of its own is shed
		if code, queued := queuedWithin(sendAs(g, "acme"), 50*time.Millisecond); !queued {
			if code != http.StatusServiceUnavailable {
				t.Fatalf("an arrival of acme answered %d while the slots were held", code)
			}
			shed++
		}
	}
	if shed == 0 {
		t.Fatal("acme's flood was all queued: the test did not congest acme")
	}
	// globex, meanwhile: two requests, neither refused.
	globex := []chan int{sendAs(g, "globex"), sendAs(g, "globex")}
	for i, answer := range globex {
		if code, queued := queuedWithin(answer, 50*time.Millisecond); !queued {
			t.Fatalf("globex's request %d answered %d while acme flooded: want it queued, within its share", i, code)
		}
	}
	// The next two slots acme gives back go to globex, before acme's
	// waiters who came earlier: globex holds none, acme all.
	for i := range 2 {
		h.release["acme"] <- struct{}{}
		if got := <-h.entered; got != "globex" {
			t.Errorf("slot %d given back went to %s, want globex (holding fewer for its weight)", i, got)
		}
	}
	for range 2 {
		h.release["globex"] <- struct{}{}
	}
	for i, answer := range globex {
		if code := <-answer; code != http.StatusOK {
			t.Errorf("globex's request %d = %d, want 200", i, code)
		}
	}
	// Let every acme request still in go, and count what was served.
	for range 64 {
		h.release["acme"] <- struct{}{}
	}
	for _, answer := range append(acme, waiting...) {
		if code := <-answer; code != http.StatusOK {
			t.Errorf("an acme request queued before the flood = %d, want it served", code)
		}
	}
}

// Slots go to tenants in proportion to their weights: acme (weight 3)
// and globex (weight 1), both waiting, share four slots three to one. A
// slot given back goes to the waiting tenant holding the fewest for its
// weight.
func TestSlotsGoToTenantsByWeight(t *testing.T) {
	h := newTenantsHandler("acme", "globex")
	g := guarded(httpapi.NewAdmission(4, 100, 5*time.Second, map[string]int{"acme": 3, "globex": 1}), h)
	var answers []chan int
	for range 4 {
		answers = append(answers, sendAs(g, "acme"))
		<-h.entered
	}
	for range 4 {
		answers = append(answers, sendAs(g, "acme"))
	}
	for range 3 {
		answers = append(answers, sendAs(g, "globex"))
	}
	time.Sleep(50 * time.Millisecond) // all queued
	for i, step := range []struct{ give, want string }{
		{"acme", "globex"}, // acme 3 for 3, globex 0 for 1
		{"acme", "acme"},   // acme 2 for 3 is fewer than globex 1 for 1
		{"globex", "globex"},
		{"acme", "acme"},
		{"acme", "acme"}, // acme 2 for 3 again: acme holds 3, globex 1, as its weight says
	} {
		h.release[step.give] <- struct{}{}
		if got := <-h.entered; got != step.want {
			t.Errorf("step %d: the slot %s gave back went to %s, want %s", i, step.give, got, step.want)
		}
	}
	for range 16 {
		h.release["acme"] <- struct{}{}
		h.release["globex"] <- struct{}{}
	}
	for i, answer := range answers {
		if code := <-answer; code != http.StatusOK {
			t.Errorf("request %d = %d, want every one served", i, code)
		}
	}
}
