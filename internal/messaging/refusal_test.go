package messaging_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/messaging"
)

// A command refused for its form is answered, on its tenant's results
// subject, with the very problem document HTTP sends for the same fault
// (status and bytes), besides its dead letter for the operators.
func TestARefusedCommandIsAnsweredWithTheProblemHTTPSends(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme, acmeJS := w.tenantJS("acme")
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	run := time.Now().UnixNano()

	for _, tc := range []struct {
		name string
		keys []string // the Idempotency-Key values, through either door
		body string
	}{
		{"no Idempotency-Key", nil, createBody("cus_refused_1")},
		{"two Idempotency-Key values", []string{fmt.Sprintf("two-a-%d", run), fmt.Sprintf("two-b-%d", run)}, createBody("cus_refused_2")},
		{"a malformed Idempotency-Key", []string{"bad key"}, createBody("cus_refused_3")},
		{"a body that is not JSON", []string{fmt.Sprintf("not-json-%d", run)}, `{"customer_id":"cus_refused_4",`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := nats.NewMsg(messaging.CommandSubject("acme", "create"))
			m.Header[messaging.HeaderKey] = tc.keys
			m.Data = []byte(tc.body)
			if _, err := acmeJS.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			r := next(t, results, "refusal")
			status, body := httpAnswer(t, w, tc.keys, tc.body)
			if r.Header.Get(messaging.HeaderStatus) != strconv.Itoa(status) || status != http.StatusBadRequest || !bytes.Equal(r.Data, body) {
				t.Errorf("message door: %s %s\nHTTP: %d %s", r.Header.Get(messaging.HeaderStatus), r.Data, status, body)
			}
			if r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
			}
			<-w.counters.deadCh
		})
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id LIKE 'cus_refused_%'"); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
	waitDLQDepth(t, w, 4)
}

// httpAnswer is what POST /v1/orders answers with these keys and body.
func httpAnswer(t *testing.T, w *world, keys []string, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.api.BaseURL+"/v1/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenants["acme"])
	req.Header.Set("Content-Type", "application/json")
	for _, k := range keys {
		req.Header.Add("Idempotency-Key", k)
	}
	resp, err := w.api.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, bytes.TrimSpace(b.Bytes())
}

// A broker may carry more than HTTP accepts (its max_payload raised to
// 2 MiB here). A body of exactly 1 MiB is served, as over HTTP; one byte
// more is refused with HTTP's 413, byte for byte, and dead-lettered.
func TestACommandBodyOverHTTPsBoundIsRefusedWithItsAnswer(t *testing.T) {
	w := newWorld(t)
	js := bigBroker(t)
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) { c.JS = js })
	results := make(chan *nats.Msg, 16)
	sub, err := js.Conn().ChanSubscribe(messaging.ResultSubject("acme", "create"), results)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	run := time.Now().UnixNano()

	for _, n := range []int{decode.MaxBody, decode.MaxBody + 1} {
		key := fmt.Sprintf("body-%d-%d", n, run)
		body := createBody("cus_" + key)
		body += strings.Repeat(" ", n-len(body)) // JSON allows the spaces; the bound counts them
		publish(t, js, messaging.CommandSubject("acme", "create"), key, body)
		r := resultOf(t, results, key)
		switch n {
		case decode.MaxBody:
			if r.Header.Get(messaging.HeaderStatus) != "201" {
				t.Errorf("%d bytes: %v %s, want 201", n, r.Header, r.Data)
			}
		default:
			h := w.api.Do(t, http.MethodPost, "/v1/orders", key+"-http", body)
			if r.Header.Get(messaging.HeaderStatus) != "413" || h.Status != http.StatusRequestEntityTooLarge || !bytes.Equal(r.Data, h.Body) {
				t.Errorf("%d bytes: message door %v %s; HTTP %d %s", n, r.Header, r.Data, h.Status, h.Body)
			}
			select {
			case <-w.counters.deadCh:
			case <-time.After(30 * time.Second):
				t.Errorf("%d bytes: not dead-lettered", n)
			}
		}
	}
}

// resultOf waits for the result of the command with key, passing over
// others (a command redelivered publishes its result again).
func resultOf(t *testing.T, results chan *nats.Msg, key string) *nats.Msg {
	t.Helper()
	for {
		if r := next(t, results, "result of "+key); r.Header.Get(messaging.HeaderKey) == key {
			return r
		}
	}
}

// bigBroker starts a NATS server of the test's own, with JetStream, the
// service's streams and a max_payload of 2 MiB, and connects to it.
func bigBroker(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), MaxPayload: 2 << 20, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the test's NATS server did not start")
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := messaging.EnsureStreams(context.Background(), js, messaging.StreamWindows{Redelivery: time.Hour, Compensation: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return js
}

// A dead letter is its command plus the Dead-Letter-* headers. At exactly
// the broker's max_payload it is stored whole; one byte more and the
// broker would refuse it, with its body or without the tenant's other
// headers alike: it is stored at once without its body (its size and
// digest kept), never tried again as if the DLQ were down, and a replay of
// it is refused with the reason.
func TestALetterOverMaxPayloadIsStoredAtOnceWithoutItsBody(t *testing.T) {
	w := newWorld(t)
	errs := &errorLog{records: make(chan slog.Record, 64)}
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) { c.Logger = slog.New(errs) })
	maxPayload := int(w.nc.MaxPayload())
	subject := messaging.CommandSubject("acme", "create")

	// Three commands that differ only in their body's size (no key: each
	// is refused, and dead-lettered at once, with the same reason), so
	// their letters' headers are the same size: measured on the first.
	publish(t, w.js, subject, "", "small")
	small := letterOfCommand(t, w, 1)
	headerSize := len("NATS/1.0\r\n\r\n")
	for k, vs := range small.Header {
		for _, v := range vs {
			headerSize += len(k) + len(": \r\n") + len(v)
		}
	}
	fits := strings.Repeat("f", maxPayload-headerSize)
	publish(t, w.js, subject, "", fits)
	over := strings.Repeat("o", maxPayload-headerSize+1)
	publish(t, w.js, subject, "", over)

	t.Run("a letter of exactly max_payload is stored whole", func(t *testing.T) {
		d := letterOfCommand(t, w, 2)
		if string(d.Data) != fits || d.Header.Get(messaging.HeaderDLBodySize) != "" || !strings.Contains(d.Reason(), "idempotency_key_missing") {
			t.Errorf("letter of %d bytes: body %d bytes, headers %v", headerSize+len(fits), len(d.Data), d.Header)
		}
	})
	t.Run("one byte more: stored without its body, its size and digest kept", func(t *testing.T) {
		d := letterOfCommand(t, w, 3)
		sum := sha256.Sum256([]byte(over))
		if len(d.Data) != 0 || d.Header.Get(messaging.HeaderDLBodySize) != strconv.Itoa(len(over)) ||
			d.Header.Get(messaging.HeaderDLBodyDigest) != "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":" {
			t.Errorf("letter: body %d bytes, headers %v", len(d.Data), d.Header)
		}
		if !strings.Contains(d.Reason(), "idempotency_key_missing") || !strings.Contains(d.Reason(), "without its body") {
			t.Errorf("Dead-Letter-Reason = %q, want the refusal and that the body is not kept", d.Reason())
		}
		replayed, err := (&messaging.DLQ{JS: w.js}).Replay(context.Background(), time.Hour, d.Sequence)
		if err != nil || len(replayed) != 1 || !strings.Contains(replayed[0].Refused, "without its body") {
			t.Errorf("replay = %+v, %v; want it refused: there is no body to send", replayed, err)
		}
	})
	t.Run("each stored the first time it was handled: none tried again for the DLQ, or given up", func(t *testing.T) {
		waitAckPending(t, w, 0)
		for len(errs.records) > 0 {
			r := <-errs.records
			t.Errorf("error log: %s", r.Message)
		}
		c := w.counters
		if dead, givenUp := c.get(c.dead, "create"), c.get(c.givenUp, "create"); dead != 3 || givenUp != 0 {
			t.Errorf("dead-lettered %d, given up %d; want 3, 0", dead, givenUp)
		}
	})
}

// letterOfCommand waits for the dead letter of the command with sequence
// seq in ORDER_COMMANDS.
func letterOfCommand(t *testing.T, w *world, seq uint64) messaging.DeadLetter {
	t.Helper()
	n := strconv.FormatUint(seq, 10)
	return letterWhere(t, w, "command "+n, func(d messaging.DeadLetter) bool { return d.Header.Get(messaging.HeaderDLSequence) == n })
}
