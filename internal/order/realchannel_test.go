package order_test

// The real mock channel as a test's payment channel: for the tests whose
// point is the channel's own behaviour (its key window, its statuses,
// settling later), which the in-memory acquirer (usecase_test.go) does not
// play.

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// realChannel is the mock channel, served over HTTP on its own fresh
// database, with a pool to that database, and its key window.
//
// When t records, the mock's calls are recorded as the caller received
// them (recordedChannel). Its settling of what it took on happens in its
// own loop, on its own clock, which the test cannot order against those
// calls: the run says so (steps.Unrecorded), and the model settles freely.
// Its forgetting is the test's doing (ageCharge) and is recorded there.
type realChannel struct {
	srv    *mockchannel.Server
	url    string
	db     *gorm.DB
	window time.Duration
}

func openChannel(t *testing.T, opts mockchannel.Options) realChannel {
	t.Helper()
	chURL := testdb.Fresh(t, "realchannel")
	srv, err := mockchannel.Open(context.Background(), chURL, opts)
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	db, err := database.Open(context.Background(), chURL, database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	settlesUnrecorded(t)
	window := opts.KeyWindow
	if window <= 0 {
		window = mockchannel.DefaultKeyWindow
	}
	return realChannel{srv: srv, url: hs.URL, db: db, window: window}
}

// settlesUnrecorded notes in t's run that its channel (the mock over HTTP)
// settles what it took on without recording it.
func settlesUnrecorded(t *testing.T) {
	if l := recorded(t); l != nil {
		l.Record(t.Context(), steps.Unrecorded{What: "settle"})
	}
}

// ageCharge makes the channel's charge of order id older by d. When that
// takes the charge past the key window, the channel no longer deduplicates
// its key: the test made it forget, and records the step.
func (ch realChannel) ageCharge(t *testing.T, id string, d time.Duration) {
	t.Helper()
	l := recorded(t)
	known := l != nil && ch.untilForgotten(t, id, ch.window) > 0
	if res := ch.db.Exec("UPDATE charges SET created_at = created_at - make_interval(secs => ?) WHERE reference = ?",
		d.Seconds(), id); res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("ageing the channel's charge: %d rows, %v", res.RowsAffected, res.Error)
	}
	if known && ch.untilForgotten(t, id, ch.window) == 0 {
		var key string
		if err := ch.db.Raw("SELECT idempotency_key FROM charges WHERE reference = ?", id).Scan(&key).Error; err != nil {
			t.Fatal(err)
		}
		l.Record(t.Context(), steps.Channel{Call: "forget", Key: key})
	}
}

// untilForgotten is how long, by the channel's clock, until the channel
// no longer deduplicates the key of order id's charge.
func (ch realChannel) untilForgotten(t *testing.T, id string, window time.Duration) time.Duration {
	t.Helper()
	var secs float64
	if err := ch.db.Raw("SELECT EXTRACT(EPOCH FROM created_at + make_interval(secs => ?) - now())::float8 FROM charges WHERE reference = ?",
		window.Seconds(), id).Scan(&secs).Error; err != nil {
		t.Fatal(err)
	}
	return time.Duration(max(secs, 0) * float64(time.Second))
}

// succeeded counts the channel's succeeded charges of order id.
func (ch realChannel) succeeded(id string) int {
	n := 0
	for _, c := range ch.srv.Charges() {
		if c.Reference == id && c.Status == payment.StatusSucceeded {
			n++
		}
	}
	return n
}

// settledAll waits until nothing in table (charges or refunds) is still
// taken on: pending, or requiring action. It reads the channel's database,
// so that the wait is no lookup the channel counts.
func (ch realChannel) settledAll(t *testing.T, table string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var open int64
		if err := ch.db.Raw("SELECT count(*) FROM " + table + " WHERE status IN ('pending', 'requires_action')").Scan(&open).Error; err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			return
		}
	}
	t.Fatalf("the channel did not settle its %s within 10s", table)
}
