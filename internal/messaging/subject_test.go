package messaging_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orderservice/orderservice/internal/messaging"
)

// One command on orders.commands.globex.<4,050 × "x">, inside the broker's
// 4,096-byte control line as it is sent. The service once dead-lettered it
// to a subject built from that one (plus its reply inbox), a protocol line
// the broker refused by closing the service's connection: from then on no
// tenant's command was answered. globex's own user may no longer publish
// it (TenantPermissions: the five operation subjects only), but a broker
// of the operator's with wider permissions would pass it, so the service
// is proven on it too, published by a user the broker lets: the subject is
// parsed before any part of it is used, the command is refused, its tenant
// told why, its dead letter kept under a fixed subject, and acme is served
// before, and after, as if nothing happened.
func TestACommandOnAnOverlongSubjectCutsNoTenantOff(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme, acmeJS := w.tenantJS("acme")
	acmeResults := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	globex := w.tenantConn("globex")
	globexResults := subscribe(t, globex, messaging.ResultPrefix+"globex.>")
	run := time.Now().UnixNano()
	served := func(when string) {
		t.Helper()
		key := fmt.Sprintf("acme-%s-%d", when, run)
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), key, createBody("cus_"+key))
		r := within(t, acmeResults, 30*time.Second, "result of acme's create "+when+" globex's command")
		if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderKey) != key {
			t.Fatalf("acme's create %s globex's command: %v %s", when, r.Header, r.Data)
		}
	}

	served("before")
	long := messaging.CommandSubject("globex", strings.Repeat("x", 4050))
	m := nats.NewMsg(long)
	m.Header.Set(messaging.HeaderKey, "attack-1")
	m.Data = []byte(createBody("cus_attack"))
	// A plain publish: JetStream stores it all the same, and its
	// acknowledgement's reply subject would not fit on the line.
	if err := w.nc.PublishMsg(m); err != nil {
		t.Fatalf("the publish: %v", err)
	}
	if err := w.nc.Flush(); err != nil || !w.nc.IsConnected() {
		t.Fatalf("the broker refused the publisher's own line (%v): the subject must be inside its max_control_line for the test to mean anything", err)
	}
	handled(t, w)
	served("after")

	t.Run("the service's connection is still up", func(t *testing.T) {
		if !w.nc.IsConnected() {
			t.Errorf("the service's connection is %v (last error %v)", w.nc.Status(), w.nc.LastError())
		}
	})
	t.Run("globex is told why, on its own results subject, with the problem HTTP sends", func(t *testing.T) {
		r := within(t, globexResults, 30*time.Second, "globex's refusal")
		if r.Subject != messaging.ResultSubject("globex", messaging.Malformed) || r.Header.Get(messaging.HeaderStatus) != "400" ||
			r.Header.Get(messaging.HeaderKey) != "attack-1" || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("refusal on %s: %v", r.Subject, r.Header)
		}
		if jsonField(t, r.Data, "code") != "invalid_request" || !strings.Contains(jsonField(t, r.Data, "detail"), "unknown operation") ||
			!strings.Contains(jsonField(t, r.Data, "detail"), "(4050 bytes)") || len(r.Data) > 1024 {
			t.Errorf("problem (%d bytes): %s", len(r.Data), r.Data)
		}
	})
	t.Run("its dead letter is under the fixed subject, the original subject truncated and said so", func(t *testing.T) {
		letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
		if err != nil || len(letters) != 1 {
			t.Fatalf("dlq list: %d letters, %v", len(letters), err)
		}
		d := letters[0]
		if !strings.HasPrefix(long, d.Subject) || len(d.Subject) != 256 ||
			d.Header.Get(messaging.HeaderDLSubjectTruncated) != strconv.Itoa(len(long)) {
			t.Errorf("Dead-Letter-Subject (%d bytes) %q, truncated %q", len(d.Subject), d.Subject[:min(40, len(d.Subject))],
				d.Header.Get(messaging.HeaderDLSubjectTruncated))
		}
		if got := rawDLQSubject(t, w, d.Sequence); got != messaging.DLQMalformed {
			t.Errorf("the letter is kept under %.60q, want %s", got, messaging.DLQMalformed)
		}
		replayed, err := (&messaging.DLQ{JS: w.js}).Replay(context.Background(), time.Hour, d.Sequence)
		if err != nil || len(replayed) != 1 || !strings.Contains(replayed[0].Refused, "truncated") {
			t.Errorf("a replay of it = %+v, %v; want it refused: there is no subject to replay it to", replayed, err)
		}
	})
}

// handled waits until the consumer has dealt with every command the
// stream holds, or its connection is gone (as the old service's was).
func handled(t *testing.T, w *world) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !w.nc.IsConnected() {
			return
		}
		cons, err := w.js.Consumer(context.Background(), messaging.CommandsStream, messaging.ConsumerFor("globex"))
		if err != nil {
			continue
		}
		if info, err := cons.Info(context.Background()); err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
	}
	t.Fatal("the consumer did not deal with globex's command")
}

// rawDLQSubject is the subject the DLQ stored the letter seq under.
func rawDLQSubject(t *testing.T, w *world, seq uint64) string {
	t.Helper()
	s, err := w.js.Stream(context.Background(), messaging.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Subject
}

// Each bound of the message door at its edge: the longest accepted is
// served, one byte more is refused, with the tenant told why and the
// command dead-lettered.
func TestTheDoorsBoundsAtTheirEdges(t *testing.T) {
	longest := strings.Repeat("t", messaging.MaxTenantLength)
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) {
		c.Tenants = map[string]string{"acme": tenants["acme"], "globex": tenants["globex"], longest: "key-of-the-longest"}
	})
	run := time.Now().UnixNano()

	t.Run("a tenant's name: 64 bytes is a tenant, and is served; 65 is none", func(t *testing.T) {
		if err := messaging.CheckTenant(longest); err != nil {
			t.Errorf("CheckTenant(%d bytes) = %v", len(longest), err)
		}
		if err := messaging.CheckTenant(longest + "t"); err == nil || !strings.Contains(err.Error(), "longer than 64") {
			t.Errorf("CheckTenant(%d bytes) = %v, want it refused for its length", len(longest)+1, err)
		}
		results := subscribe(t, w.nc, messaging.ResultSubject(longest, "create"))
		key := fmt.Sprintf("longest-tenant-%d", run)
		publish(t, w.js, messaging.CommandSubject(longest, "create"), key, createBody("cus_"+key))
		if r := next(t, results, "result of the longest tenant's create"); r.Header.Get(messaging.HeaderStatus) != "201" {
			t.Errorf("result %v %s", r.Header, r.Data)
		}
	})

	t.Run("an Idempotency-Key: 255 characters is served; 256 is refused, and answered", func(t *testing.T) {
		results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))
		for _, n := range []int{255, 256} {
			key := fmt.Sprintf("%d-%d-", n, run)
			key += strings.Repeat("k", n-len(key))
			publish(t, w.js, messaging.CommandSubject("acme", "create"), key, createBody(fmt.Sprintf("cus_key_%d", n)))
			r := next(t, results, fmt.Sprintf("result of the command with a %d-character key", n))
			want := map[int]string{255: "201", 256: "400"}[n]
			if r.Header.Get(messaging.HeaderStatus) != want || r.Header.Get(messaging.HeaderKey) != key {
				t.Errorf("%d characters: %v %s, want %s", n, r.Header, r.Data, want)
			}
			if n == 256 && jsonField(t, r.Data, "code") != "idempotency_key_invalid" {
				t.Errorf("%d characters: %s", n, r.Data)
			}
		}
	})

	t.Run("a subject in a dead letter: 256 bytes is kept whole; 257 is cut to 256, and says so", func(t *testing.T) {
		for _, n := range []int{256, 257} {
			subject := messaging.CommandSubject("globex", "")
			subject += strings.Repeat("y", n-len(subject))
			key := fmt.Sprintf("subject-%d-%d", n, run)
			publish(t, w.js, subject, key, createBody("cus_subject"))
			d := letterWhere(t, w, key, func(d messaging.DeadLetter) bool { return d.Key() == key })
			truncated := d.Header.Get(messaging.HeaderDLSubjectTruncated)
			switch {
			case n == 256 && (d.Subject != subject || truncated != ""):
				t.Errorf("%d bytes: Dead-Letter-Subject %d bytes, truncated %q; want it whole", n, len(d.Subject), truncated)
			case n == 257 && (d.Subject != subject[:256] || truncated != "257"):
				t.Errorf("%d bytes: Dead-Letter-Subject %d bytes, truncated %q; want its first 256 and 257", n, len(d.Subject), truncated)
			}
		}
	})
}

// letterWhere waits for the dead letter that is the one wanted.
func letterWhere(t *testing.T, w *world, what string, wanted func(messaging.DeadLetter) bool) messaging.DeadLetter {
	t.Helper()
	q := &messaging.DLQ{JS: w.js}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		letters, err := q.List(context.Background())
		if err != nil {
			t.Fatalf("dlq list: %v", err)
		}
		for _, d := range letters {
			if wanted(d) {
				return d
			}
		}
	}
	t.Fatalf("no dead letter of %s", what)
	return messaging.DeadLetter{}
}
