package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Door is the service's door to the broker: one connection, and on it the
// command consumer and the outbox relay. nats.go reconnects by itself after
// a network failure, for as long as it takes. A connection the server
// closes for good is another matter: a protocol error ("maximum control
// line exceeded"), credentials refused twice in a row (an auth change),
// leave a closed connection that nats.go never opens again, and everything
// on it deaf. The door dials a new one, prepares the broker again (the
// streams, the retention check), and starts the consumer and the relay on
// it, retrying with backoff until it can.
//
// While the connection is not usable (reconnecting, or closed and being
// opened again) the door is down, and Ready says why: /readyz answers 503
// and orderservice_broker_door_up is 0.
type Door struct {
	// Dial connects to the broker with the service's credentials.
	Dial func() (*nats.Conn, error)
	// Prepare readies the broker on a new connection before anything runs
	// on it; an error keeps the door down, and is tried again.
	Prepare  func(ctx context.Context, js jetstream.JetStream) error
	Consumer *Consumer
	Relay    *Relay
	// Retry bounds the wait between two attempts to open the door again.
	Retry Backoff
	// Reopened is told each time the door opened again on a new
	// connection; nil does nothing.
	Reopened func()
	Logger   *slog.Logger

	// life serializes what starts and stops the work on a connection; it
	// is a channel so that a shutdown can give up waiting for it.
	life       chan struct{}
	noCommands atomic.Bool // StopCommands was called: the consumer is not started again
	stopWatch  context.CancelFunc
	watching   chan struct{} // closed when the watch has returned
	relayStop  context.CancelFunc
	relayDone  chan struct{}

	mu   sync.Mutex // guards what follows, read by Ready and JS
	conn *nats.Conn
	js   jetstream.JetStream
	down string // why the door is down; "" while the connection is usable
}

// Open opens the door on nc, a connection dialled and prepared by the
// caller: it starts the consumer and the relay on it and watches it. nc is
// closed when Open fails.
func (d *Door) Open(ctx context.Context, nc *nats.Conn) error {
	d.life = make(chan struct{}, 1)
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	closed, err := d.start(ctx, nc, js)
	if err != nil {
		return err
	}
	watch, stop := context.WithCancel(context.Background())
	d.stopWatch, d.watching = stop, make(chan struct{})
	go func() {
		defer close(d.watching)
		d.watch(watch, closed)
	}()
	return nil
}

// Ready is nil while the door is open: connected, and the consumer and the
// relay running on the connection; otherwise why it is not.
func (d *Door) Ready() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.down != "":
		return errors.New(d.down)
	case d.conn == nil:
		return errors.New("the broker door is not open")
	case d.conn.Status() != nats.CONNECTED:
		return fmt.Errorf("the connection to the broker is %s; it reconnects by itself", strings.ToLower(d.conn.Status().String()))
	}
	return nil
}

// Conn is the door's current connection; nil before it opened.
func (d *Door) Conn() *nats.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conn
}

// JS is JetStream on the door's current connection; nil before it opened.
func (d *Door) JS() jetstream.JetStream {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.js
}

// StopCommands stops taking commands, now and on any connection to come,
// and waits for those running, or for ctx to end. It is the first step of a
// shutdown: the relay goes on until Close.
func (d *Door) StopCommands(ctx context.Context) error {
	d.noCommands.Store(true)
	if !d.lock(ctx) {
		return fmt.Errorf("messaging: commands still running at shutdown: %w", ctx.Err())
	}
	defer d.unlock()
	return d.Consumer.Stop(ctx)
}

// Close stops watching the connection, stops the consumer and the relay,
// and closes the connection, within ctx.
func (d *Door) Close(ctx context.Context) error {
	if d.life == nil {
		return nil
	}
	d.noCommands.Store(true)
	if d.stopWatch != nil {
		d.stopWatch()
		ended(ctx, d.watching)
	}
	if !d.lock(ctx) {
		return fmt.Errorf("messaging: the broker door did not close within the shutdown: %w", ctx.Err())
	}
	defer d.unlock()
	err := d.shut(ctx, "the service is stopping")
	d.mu.Lock()
	if d.conn != nil {
		d.conn.Close()
	}
	d.mu.Unlock()
	return err
}

// watch waits for the connection to be closed for good, then opens the
// door again, until ctx ends.
func (d *Door) watch(ctx context.Context, closed <-chan error) {
	for {
		var why error
		select {
		case <-ctx.Done():
			return
		case why = <-closed:
		}
		d.logger().Error("messaging: the broker closed the connection for good; opening the broker door again", "err", why)
		if !d.lock(ctx) {
			return
		}
		err := d.shut(ctx, fmt.Sprintf("the broker closed the connection (%v); the broker door is being opened again", why))
		d.unlock()
		if err != nil { // only when ctx ended: the door is closing
			return
		}
		if closed = d.reopen(ctx); closed == nil {
			return
		}
	}
}

// reopen dials, prepares and starts until it succeeds, and returns the new
// connection's closed channel; nil when ctx ended first.
func (d *Door) reopen(ctx context.Context) <-chan error {
	for attempt := 1; ; attempt++ {
		closed, err := d.open(ctx)
		if err == nil {
			d.logger().Info("messaging: the broker door is open again", "attempts", attempt)
			if d.Reopened != nil {
				d.Reopened()
			}
			return closed
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := d.Retry.Delay(attempt)
		d.setDown(fmt.Sprintf("the broker door could not be opened again (%v); retrying", err))
		d.logger().Warn("messaging: could not open the broker door again", "attempt", attempt, "err", err, "retry_in", wait.String())
		pause(ctx, wait)
	}
}

// open dials a connection, prepares the broker on it and starts the work.
func (d *Door) open(ctx context.Context) (<-chan error, error) {
	nc, err := d.Dial()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		prepare, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = d.Prepare(prepare, js)
		cancel()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return d.start(ctx, nc, js)
}

// start runs the consumer (unless StopCommands was called) and the relay
// on nc, and returns a channel that says why nc was closed, once it is.
func (d *Door) start(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (<-chan error, error) {
	if !d.lock(ctx) {
		nc.Close()
		return nil, ctx.Err()
	}
	defer d.unlock()
	closed := make(chan error, 1)
	nc.SetClosedHandler(func(nc *nats.Conn) { closed <- nc.LastError() })
	nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
		d.logger().Warn("messaging: lost the broker connection; reconnecting", "err", err)
	})
	nc.SetReconnectHandler(func(nc *nats.Conn) {
		d.logger().Info("messaging: reconnected to the broker", "server", nc.ConnectedUrlRedacted())
	})
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		d.logger().Warn("messaging: the broker reported an error", "err", err)
	})
	d.Consumer.JS, d.Relay.JS = js, js
	if !d.noCommands.Load() {
		if err := d.Consumer.Start(ctx); err != nil {
			nc.Close()
			return nil, err
		}
	}
	relay, stop := context.WithCancel(context.Background())
	d.relayStop, d.relayDone = stop, make(chan struct{})
	go func() {
		defer close(d.relayDone)
		d.Relay.Run(relay)
	}()
	d.mu.Lock()
	d.conn, d.js, d.down = nc, js, ""
	d.mu.Unlock()
	if nc.IsClosed() { // closed before the handler was set
		select {
		case closed <- nc.LastError():
		default:
		}
	}
	return closed, nil
}

// shut stops what runs on the connection, and marks the door down with
// why. A command still running finishes first: its answer, if the
// connection is gone, is not published, and its redelivery replays it.
func (d *Door) shut(ctx context.Context, why string) error {
	d.setDown(why)
	err := d.Consumer.Stop(ctx)
	if d.relayStop != nil {
		d.relayStop()
		if !ended(ctx, d.relayDone) {
			return errors.Join(err, fmt.Errorf("messaging: the outbox relay did not stop: %w", ctx.Err()))
		}
		d.relayStop = nil
	}
	return err
}

func (d *Door) logger() *slog.Logger {
	if d.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Logger
}

func (d *Door) setDown(why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = why
}

// lock takes life, or gives up when ctx ends first.
func (d *Door) lock(ctx context.Context) bool {
	select {
	case d.life <- struct{}{}: // first, even when ctx has ended
		return true
	default:
	}
	select {
	case d.life <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// ended waits for done to be closed, or for ctx to end and then a moment
// more for what it cancelled to notice; false when that moment passed.
func ended(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-ctx.Done():
	}
	select {
	case <-done:
		return true
	case <-time.After(time.Second):
		return false
	}
}

func (d *Door) unlock() { <-d.life }
