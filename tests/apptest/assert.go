package apptest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// The assertions every package's tests share, written once.

// ProblemCode is the code member of a problem document, or "".
func ProblemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// WantProblem fails the test unless r is an application/problem+json
// document with status and code (its type, title and status members
// agreeing) that shows nothing of the service's insides. It returns the
// document.
func WantProblem(t testing.TB, r Response, status int, code string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	doc := r.JSON(t)
	if doc["code"] != code || doc["status"] != float64(status) || doc["type"] != "urn:orderservice:problem:"+code || doc["title"] == "" {
		t.Errorf("problem code=%v status=%v type=%v title=%v, want %s %d: %s", doc["code"], doc["status"], doc["type"], doc["title"], code, status, r.Body)
	}
	for _, leak := range []string{"SQLSTATE", "pq:", "constraint", "goroutine", ".go:"} {
		if strings.Contains(string(r.Body), leak) {
			t.Errorf("problem leaks %q: %s", leak, r.Body)
		}
	}
	return doc
}

// WantAnswer fails the test unless r has status and, for a problem, code
// ("" for none).
func WantAnswer(t testing.TB, what string, r Response, status int, code string) {
	t.Helper()
	if r.Status != status || ProblemCode(r.Body) != code {
		t.Fatalf("%s = %d %s, want %d %q", what, r.Status, r.Body, status, code)
	}
}

// WantExecuted fails the test if r is a replay: the first answer to an
// intent carries no Idempotent-Replayed.
func WantExecuted(t testing.TB, r Response) {
	t.Helper()
	if h := r.Header.Get("Idempotent-Replayed"); h != "" {
		t.Errorf("a response that executed carries Idempotent-Replayed: %q", h)
	}
}

// WantReplay fails the test unless again is first replayed: the same
// status, Content-Type, Location and body bytes, with Idempotent-Replayed:
// true.
func WantReplay(t testing.TB, first, again Response) {
	t.Helper()
	if again.Status != first.Status || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("replay differs:\nfirst  %d %s\nreplay %d %s", first.Status, first.Body, again.Status, again.Body)
	}
	if got := again.Header.Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("replay has Idempotent-Replayed %q, want true (headers %v)", got, again.Header)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if a, b := again.Header.Get(h), first.Header.Get(h); a != b {
			t.Errorf("replay %s %q, first %q", h, a, b)
		}
	}
}

// RecordRow is the whole stored row of scope's record as JSON text, to
// compare before and after.
func RecordRow(t testing.TB, db *gorm.DB, scope idempotency.Scope) string {
	t.Helper()
	var row string
	err := db.Raw(`SELECT row_to_json(r)::text FROM idempotency_records r
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`, scope.TenantID, scope.Operation, scope.Key).Scan(&row).Error
	if err != nil || row == "" {
		t.Fatalf("record %+v: %v", scope, err)
	}
	return row
}

// RecordState is the state of scope's record.
func RecordState(t testing.TB, db *gorm.DB, scope idempotency.Scope) idempotency.State {
	t.Helper()
	var state idempotency.State
	if err := db.Raw("SELECT state FROM idempotency_records WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?",
		scope.TenantID, scope.Operation, scope.Key).Row().Scan(&state); err != nil {
		t.Fatalf("record %+v: %v", scope, err)
	}
	return state
}

// ChannelStats reads the payment channel's counters (GET /admin/stats)
// through admin, a client of the channel's own address.
func ChannelStats(t testing.TB, admin *Client) mockchannel.Stats {
	t.Helper()
	r := admin.Do(t, http.MethodGet, "/admin/stats", "", nil)
	var s mockchannel.Stats
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &s) != nil {
		t.Fatalf("channel stats: %d %s", r.Status, r.Body)
	}
	return s
}

// Count runs a SELECT count(*) … and returns the number.
func Count(t testing.TB, db *gorm.DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Raw(query, args...).Scan(&n).Error; err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Metric reads one unlabelled gauge or counter from the service's /metrics.
func Metric(t testing.TB, baseURL, name string) float64 {
	t.Helper()
	res, err := http.Get(baseURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	f, ok := families[name]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("/metrics has no single series %s", name)
	}
	m := f.GetMetric()[0]
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// Eventually polls cond every 50ms until it holds or timeout passes; cond
// also says what it saw, for the failure.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, still not %s; last seen: %s", timeout, what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// GoroutinesIn counts the goroutines whose stack passes through fn.
func GoroutinesIn(fn string) int {
	buf := make([]byte, 8<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(stacks, fn)
}
