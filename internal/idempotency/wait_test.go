package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/tests/testdb"
)

// A wait reports how it ended, and only what ended it can: each case below
// leaves exactly one way open (a poll of an hour cannot end a wait in a test).
func TestAWaitSaysWhatEndedIt(t *testing.T) {
	s := newStore()
	claimed := func(t *testing.T, key string) (idempotency.Intent, idempotency.Claim) {
		t.Helper()
		key = fmt.Sprintf("%s-%d", key, time.Now().UnixNano()) // each run its own
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "waits", Operation: "op.money", Key: key}, Fingerprint: fp("a")}
		var c idempotency.Claim
		tx(t, func(tx *gorm.DB) (err error) { c, err = s.ClaimOrReplay(tx, in); return err })
		return in, c
	}
	// await runs w.Await in the background; its channel yields how it
	// ended and what it returned.
	await := func(ctx context.Context, w *idempotency.Waiter, scope idempotency.Scope) <-chan string {
		ended := make(chan idempotency.Wake, 1)
		w.Observe = func(how idempotency.Wake) { ended <- how }
		out := make(chan string, 1)
		go func() {
			again := w.Await(ctx, db, scope)
			out <- fmt.Sprintf("%s %t", <-ended, again)
		}()
		return out
	}
	// flagged waits until a waiter has flagged scope's record, which it
	// does after registering for its notification.
	flagged := func(t *testing.T, scope idempotency.Scope) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			rec, err := s.Get(db, scope)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Waiting {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no waiter flagged the record within 10s")
			}
		}
	}
	want := func(t *testing.T, got <-chan string, want string) {
		t.Helper()
		select {
		case g := <-got:
			if g != want {
				t.Errorf("the wait ended %q, want %q", g, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the wait had not ended after 10s, want %q", want)
		}
	}
	run := func(t *testing.T, w *idempotency.Waiter) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() { w.Run(ctx); close(stopped) }()
		t.Cleanup(func() { cancel(); <-stopped })
	}
	// listening runs w until the test ends, from the moment it listens.
	listening := func(t *testing.T, w *idempotency.Waiter) {
		t.Helper()
		run(t, w)
		for deadline := time.Now().Add(10 * time.Second); !w.Listening(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the waiter did not LISTEN within 10s")
			}
		}
	}
	waiter := func(poll time.Duration) *idempotency.Waiter {
		return &idempotency.Waiter{URL: dbURL, Poll: poll, Logger: slog.New(slog.DiscardHandler)}
	}

	t.Run("notified by the commit that moved the record", func(t *testing.T) {
		w := waiter(time.Hour)
		listening(t, w)
		in, c := claimed(t, "notified")
		got := await(context.Background(), w, in.Scope)
		flagged(t, in.Scope)
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, got, "notified true")
	})

	// Another waiter's flag is being set as this one begins: its own UPDATE
	// waits for that to commit, and it must then see the flag and wait, not
	// take the record for stored.
	t.Run("notified, after waiting for another waiter's flag", func(t *testing.T) {
		w := waiter(time.Hour)
		listening(t, w)
		in, c := claimed(t, "flag-race")
		other := db.Begin()
		defer other.Rollback()
		if err := other.Exec(`UPDATE idempotency_records SET waiting = true WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`,
			in.TenantID, in.Operation, in.Key).Error; err != nil {
			t.Fatal(err)
		}
		got := await(context.Background(), w, in.Scope)
		testdb.WaitForLockWaiter(t, db, "the waiter's flag")
		if err := other.Commit().Error; err != nil {
			t.Fatal(err)
		}
		// The record moves on only once the waiter has read the flag (or
		// ended): moved on first, "not in flight" would be its right answer.
		for deadline := time.Now().Add(10 * time.Second); len(got) == 0; time.Sleep(5 * time.Millisecond) {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			if strings.Contains(stacks, "idempotency.(*Waiter).await(") && !strings.Contains(stacks, "idempotency.flagWaiting(") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter was neither waiting nor done within 10s")
			}
		}
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, got, "notified true")
	})

	t.Run("relistened: what was announced before the LISTEN is read again", func(t *testing.T) {
		w := waiter(time.Hour)
		in, _ := claimed(t, "relistened")
		got := await(context.Background(), w, in.Scope)
		flagged(t, in.Scope)
		run(t, w)
		want(t, got, "relistened true")
	})

	t.Run("looked: with no LISTEN connection, after Poll", func(t *testing.T) {
		in, _ := claimed(t, "looked")
		want(t, await(context.Background(), waiter(20*time.Millisecond), in.Scope), "looked true")
	})

	t.Run("not in flight: nothing to wait for", func(t *testing.T) {
		in, c := claimed(t, "done")
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, await(context.Background(), waiter(time.Hour), in.Scope), "not_in_flight true")
	})

	t.Run("gave up when its context ended", func(t *testing.T) {
		in, _ := claimed(t, "gave-up")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		want(t, await(ctx, waiter(time.Hour), in.Scope), "gave_up false")
	})
}

// A LISTEN connection whose server vanishes without a word (half-open: no
// FIN, no RST, as after a partition or a failover behind a proxy) used to
// keep Listening() true until TCP gave up, minutes later: every waiter
// trusted it, heard nothing, and its client got 409 after its whole wait.
// A quiet listener now sends itself a heartbeat every Poll and gives the
// connection up when it does not come back: the waiter looks for itself,
// and the listener comes back once the path does.
func TestAHalfOpenListenConnectionIsGivenUp(t *testing.T) {
	s := newStore()
	proxy := newFreezingProxy(t, dbURL)
	w := &idempotency.Waiter{URL: proxy.url, Poll: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { w.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	listeningIs(t, w, true)

	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "waits", Operation: "op.money", Key: fmt.Sprintf("half-open-%d", time.Now().UnixNano())}, Fingerprint: fp("a")}
	var c idempotency.Claim
	tx(t, func(tx *gorm.DB) (err error) { c, err = s.ClaimOrReplay(tx, in); return err })
	ended := make(chan idempotency.Wake, 1)
	w.Observe = func(how idempotency.Wake) { ended <- how }
	waitCtx, stopWait := context.WithTimeout(context.Background(), 20*time.Second)
	defer stopWait()
	go w.Await(waitCtx, db, in.Scope)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if rec, err := s.Get(db, in.Scope); err == nil && rec.Waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never flagged the record")
		}
	}

	proxy.freeze() // the LISTEN connection goes silent; the notification below is lost
	tx(t, func(tx *gorm.DB) error {
		return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
	})
	select {
	case how := <-ended:
		if how != idempotency.Looked {
			t.Errorf("the wait ended %q, want %q: the waiter looked once the listener was given up", how, idempotency.Looked)
		}
	case <-waitCtx.Done():
		t.Fatalf("the waiter still trusted a silent LISTEN connection after 20s (Listening() = %t)", w.Listening())
	}
	listeningIs(t, w, false)
	proxy.thaw()
	listeningIs(t, w, true)
}

func listeningIs(t *testing.T, w *idempotency.Waiter, want bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); w.Listening() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Listening() stayed %t for 20s", !want)
		}
	}
}

// freezingProxy forwards TCP to PostgreSQL until frozen; frozen, it drops
// every byte both ways and closes nothing, as a vanished peer would look.
type freezingProxy struct {
	url    string
	frozen atomic.Bool
}

func newFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	upstream := u.Host
	u.Host = ln.Addr().String()
	p := &freezingProxy{url: u.String()}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				client.Close()
				continue
			}
			t.Cleanup(func() { client.Close(); server.Close() })
			go p.pipe(server, client)
			go p.pipe(client, server)
		}
	}()
	return p
}

func (p *freezingProxy) freeze() { p.frozen.Store(true) }
func (p *freezingProxy) thaw()   { p.frozen.Store(false) }

func (p *freezingProxy) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
