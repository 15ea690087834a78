package app_test

// The admission limit (HTTP_MAX_IN_FLIGHT, HTTP_MAX_QUEUE) as the running
// program applies it: a slot is held while a request works, not while it
// waits for a duplicate's outcome or for the payment channel.

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
)

// slowPaysAtTheChannel sends n pm_slow pays, each on an order of its own
// and under a key of its own, one after another: each is sent once the one
// before is at m's channel. It returns once the last is there, and a
// function that waits for the answers.
func slowPaysAtTheChannel(t *testing.T, m *app.Main, c *apptest.Client, n int) (answers func() []apptest.Response) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = placeOrder(t, c)
	}
	before := m.Channel.Stats().Requests
	rs := make([]apptest.Response, n)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // a test that stops early still outlives its pays
	for i, id := range ids {
		wg.Go(func() {
			var err error
			if rs[i], err = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", newKey("pay"), payWith("pm_slow"), nil); err != nil {
				t.Errorf("pay %d: %v", i, err)
			}
		})
		apptest.Eventually(t, 5*time.Second, fmt.Sprintf("pay %d at the channel", i), func() (bool, string) {
			got := m.Channel.Stats().Requests - before
			return got == int64(i+1), fmt.Sprintf("%d at the channel", got)
		})
	}
	return func() []apptest.Response { wg.Wait(); return rs }
}

func TestWaitingDuplicatesDoNotTakeTheAdmissionSlotsOfOtherRequests(t *testing.T) {
	isolateMoney(t)
	m := apptest.Start(t, dbURL, slowPayEnvWith(map[string]string{"HTTP_MAX_IN_FLIGHT": "4", "HTTP_MAX_QUEUE": "4", "HTTP_QUEUE_TIMEOUT": "200ms",
		// The first pay outlasts the five waves (1.5s) with room for a
		// loaded machine: a duplicate arriving after it is not waiting.
		"PAYMENT_SLOW_DELAY": "5s", "PAYMENT_CHANNEL_TIMEOUT": "7s"}))
	c := apptest.NewClient(m, apptest.KeyAcme)
	key := newKey("R2-admitted")
	id, first := startSlowPay(t, m, c, key)
	// Five times the admission limit, in waves the size of the limit: each
	// duplicate takes a slot, finds the intent in flight and gives the slot
	// back as it starts to wait, so every wave finds the slots free. Were
	// the slots held while waiting, the second wave would queue past its
	// 200ms and be refused with 503.
	const duplicates, wave = 20, 4
	var wg sync.WaitGroup
	answers := make([]apptest.Response, duplicates)
	for i := range answers {
		wg.Go(func() {
			answers[i], _ = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith("pm_slow"), preferWait(10))
		})
		if i%wave == wave-1 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	// With twenty waiting, a new intent is still admitted at once.
	if r := c.Do(t, http.MethodPost, "/v1/orders", newKey("create-admitted"), map[string]any{"customer_id": "cus_admitted", "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 1, "unit_price": 100}}}); r.Status != http.StatusCreated {
		t.Errorf("a create while %d duplicates wait = %d %s, want 201", duplicates, r.Status, r.Body)
	}
	wg.Wait()
	orig, _ := first()
	for i, a := range answers {
		if a.Status != http.StatusOK || !bytes.Equal(a.Body, orig.Body) || a.Header.Get("Preference-Applied") != "wait=10" {
			t.Errorf("duplicate %d = %d %s (Preference-Applied %q), want the first's 200 after waiting", i, a.Status, a.Body, a.Header.Get("Preference-Applied"))
		}
	}
}

func TestAPayGivesItsAdmissionSlotBackWhileTheChannelWorks(t *testing.T) {
	// Two slots and no queue: a request that finds both taken is refused at
	// once. Four pays stand at the slow channel together, and a create is
	// still admitted; were the slots held through the channel call, the
	// third pay would be refused with 503.
	isolateMoney(t)
	m := apptest.Start(t, dbURL, slowPayEnvWith(map[string]string{"HTTP_MAX_IN_FLIGHT": "2", "HTTP_MAX_QUEUE": "0"}))
	c := apptest.NewClient(m, apptest.KeyAcme)
	answers := slowPaysAtTheChannel(t, m, c, 4)
	if r := c.Do(t, http.MethodPost, "/v1/orders", newKey("create-admitted"), map[string]any{"customer_id": "cus_admitted", "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 1, "unit_price": 100}}}); r.Status != http.StatusCreated {
		t.Errorf("a create while 4 pays are at the channel = %d %s, want 201", r.Status, r.Body)
	}
	for i, r := range answers() {
		if r.Status != http.StatusOK || r.JSON(t)["status"] != "PAID" {
			t.Errorf("pay %d = %d %s, want 200 PAID", i, r.Status, r.Body)
		}
	}
	if got := m.Channel.Stats().Charges; got != 4 {
		t.Errorf("the channel made %d charges, want 4", got)
	}
}
