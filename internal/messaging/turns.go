package messaging

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"
)

// Commands are served in turns across tenants. One durable pull consumer
// on ORDER_COMMANDS delivers in the order commands were stored, so one
// tenant's backlog of thousands would put every other tenant's command
// behind it. Instead each tenant has a durable consumer of its own
// (ConsumerFor, filter orders.commands.<tenant>.>), shared by every
// instance as the single one was: one instance at a time handles a
// command, and another takes it over when the first dies. An instance
// serves each tenant from a lane of its own, and its workers go to the
// lanes in the order the lanes asked for one (a FIFO semaphore): a lane
// asks for one worker at a time, so a tenant with a backlog gets a turn,
// then every other tenant with a command waiting gets one, and so on. A
// tenant alone takes every idle worker at once.
//
// A lane with nothing to do listens: one pull waits at the broker for the
// tenant's next command, holding no worker, so a quiet tenant's command is
// fetched the moment it is stored, and waits only for its turn.
//
// An instance serves the tenants of its API_KEYS and leaves every other
// alone. Instances may not agree on API_KEYS (a tenant being added or
// removed across a rolling restart): one that dead-lettered the commands
// of a tenant it does not know would refuse what another instance serves,
// and a command would be both answered and dead-lettered. A tenant no
// instance knows has no broker user either (the embedded server's users,
// deploy/nats.conf), so its commands can only be published by the
// service's own user; they stay in ORDER_COMMANDS until its max_age, and
// are served if the tenant is given back its key in time (its consumer
// keeps its place that long).

// ConsumerFor is the durable pull consumer of tenant's commands that every
// instance shares.
func ConsumerFor(tenant string) string { return "orderservice-tenant-" + tenant }

// legacyConsumer is the single consumer of every command that versions
// before turns shared; Start removes it once the tenants' ones are there.
const legacyConsumer = "orderservice"

// ConsumerConfig is what every command consumer shares. JetStream's own
// MaxDeliver is unlimited on purpose: COMMAND_MAX_DELIVER is enforced by
// handle, which dead-letters a command on its last transient failure, and
// at once a command delivered more often than that whose intent no run
// finished (overDelivered). Were the server to stop delivering instead, a
// command whose dead-lettering failed would stay in the stream unhandled,
// and no one would know; this way its dead letter is tried again, and
// given up only loudly (deadLetter).
func ConsumerConfig(ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 1000}
}

// listenWait is how long a listening lane's pull waits at the broker
// before it is made again.
const listenWait = time.Second

// serving is one run of a Consumer, from Start to Stop.
type serving struct {
	stop     context.CancelFunc
	stopping <-chan struct{} // closed by Stop: a postponed command is handed back
	lanes    sync.WaitGroup  // the fetch loops
	workers  sync.WaitGroup  // the commands being run
	// idle holds one token per idle worker; its waiters are served in the
	// order they came, which is what makes the lanes take turns.
	idle *semaphore.Weighted
	// waiters are the commands postponed for their intent in flight.
	waiters *waiters
}

// Start creates (or updates) the durable consumers and starts a lane for
// each; ctx bounds the setup only, Stop ends the work.
//
// Commands are fetched only for workers that are free (but the one a
// listening lane waits for), and run at once: a fetched command's ack wait
// runs from the moment JetStream hands it over, so one that sat in a
// buffer behind slow commands would be redelivered (and dead-lettered at
// last) while nobody had even started it. Each fetched command says "in
// progress" while it waits for its turn and while it runs.
func (c *Consumer) Start(ctx context.Context) error {
	lanes, err := c.consumers(ctx)
	if err != nil {
		return err
	}
	run, stop := context.WithCancel(context.Background())
	s := &serving{stop: stop, stopping: run.Done(), idle: semaphore.NewWeighted(int64(c.Workers)), waiters: newWaiters()}
	c.serving = s // before any lane runs: a postponed command waits on s
	for _, l := range lanes {
		s.lanes.Go(func() { c.serveTenant(run, s, l) })
	}
	return nil
}

// Stop stops fetching, lets the workers finish the commands they hold and
// returns when they have, or when ctx ends. Nothing fetched is left
// waiting: a command a lane holds is run before the lane returns.
func (c *Consumer) Stop(ctx context.Context) error {
	s := c.serving
	if s == nil {
		return nil
	}
	s.stop()
	done := make(chan struct{})
	go func() { s.lanes.Wait(); s.workers.Wait(); close(done) }()
	select {
	case <-done:
		c.serving = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("messaging: commands still running at shutdown: %w", ctx.Err())
	}
}

// lane is one tenant's durable consumer, and what makes it again.
type lane struct {
	cons jetstream.Consumer
	cfg  jetstream.ConsumerConfig
}

// serveTenant is one tenant's lane: it listens while the tenant has no
// command waiting, and takes turns while it has. A consumer the broker
// says is gone (deleted by an operator, or with its stream) is made again,
// from the start of the stream: the records replay what it had delivered.
func (c *Consumer) serveTenant(ctx context.Context, s *serving, l lane) {
	backlog := false
	for ctx.Err() == nil {
		var err error
		if backlog {
			backlog, err = c.takeTurn(ctx, s, l.cons)
		} else {
			backlog, err = c.listen(s, l.cons)
		}
		if consumerGone(err) && ctx.Err() == nil {
			// Made again, or found there (nothing answered the pull
			// while its leader moved, say): either way pulled again
			// after the pause, not at once.
			if cons, again := ensureConsumer(ctx, c.JS, l.cfg); again == nil {
				l.cons = cons
			} else {
				err = fmt.Errorf("%w; making the consumer again: %w", err, again)
			}
		}
		if err != nil && ctx.Err() == nil {
			c.logger().Warn("messaging: fetching commands", "consumer", l.cfg.Durable, "err", err)
			pause(ctx, 100*time.Millisecond)
		}
	}
}

// consumerGone reports whether a pull's error says its consumer no longer
// exists: the broker ended the pull for it, or nothing answers pulls on it.
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrNoResponders)
}

// listen waits, holding no worker, for the tenant's next command, then
// for its turn for a worker, and runs it; it reports whether one came.
//
// The broker ends the pull (after listenWait, or earlier with a status),
// never the service: a command the broker handed over just as the service
// gave up waiting would be delivered and never handled, its delivery
// spent, until its ack wait ran out. So a Stop waits for the pull's end,
// and what it brought is run.
func (c *Consumer) listen(s *serving, cons jetstream.Consumer) (bool, error) {
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(listenWait))
	if err != nil {
		return false, err
	}
	came := false
	for msg := range batch.Messages() {
		came = true
		stop := c.keepInProgress(msg)
		_ = s.idle.Acquire(context.Background(), 1) // even when stopping: a fetched command is run
		stop()
		c.run(s, msg)
	}
	return came, fetchErr(batch)
}

// takeTurn waits for the lane's turn for a worker, then fetches as many
// commands as it holds workers: one, or every idle one when no other lane
// is waiting. It reports whether the tenant had any.
func (c *Consumer) takeTurn(ctx context.Context, s *serving, cons jetstream.Consumer) (bool, error) {
	if s.idle.Acquire(ctx, 1) != nil {
		return false, nil
	}
	held := 1
	for held < c.Workers && s.idle.TryAcquire(1) {
		held++
	}
	batch, err := cons.FetchNoWait(held)
	if err != nil {
		s.idle.Release(int64(held))
		return false, err
	}
	got := 0
	for msg := range batch.Messages() {
		c.run(s, msg)
		got++
	}
	s.idle.Release(int64(held - got))
	return got > 0, fetchErr(batch)
}

// run hands msg to a worker of its own, whose idle token the caller holds.
func (c *Consumer) run(s *serving, msg jetstream.Msg) {
	s.workers.Go(func() {
		defer s.idle.Release(1)
		c.handle(context.Background(), msg)
	})
}

// fetchErr is what went wrong with a fetch, but its end: the pull's
// expiry, no command waiting, or the broker ending the pull for a reason
// that a new pull is the answer to (its consumer's leader moved, the
// server is shutting down and the connection will be opened elsewhere).
func fetchErr(batch jetstream.MessageBatch) error {
	err := batch.Error()
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) ||
		errors.Is(err, jetstream.ErrConsumerLeadershipChanged) || errors.Is(err, jetstream.ErrServerShutdown) {
		return nil
	}
	return err
}

// consumers creates or updates the durable consumers every instance
// shares, one per tenant of c.Tenants. Made now, a
// consumer starts at the beginning of the stream, or, on a stream the
// single consumer of earlier versions still reads, just past what that one
// acknowledged in order (its ack floor), and that one is then removed: a
// command it had delivered and not yet acknowledged (in flight on an
// instance not yet upgraded) is delivered again, and the records make it
// one intent. An existing consumer keeps its place.
//
// A consumer no instance pulls from for the stream's max_age is removed by
// the server (a tenant taken out of API_KEYS leaves one behind): every
// command it had delivered has expired by then, so one made again from the
// beginning delivers exactly those it never did.
func (c *Consumer) consumers(ctx context.Context) (lanes []lane, err error) {
	stream, err := c.JS.Stream(ctx, CommandsStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", CommandsStream, err)
	}
	base := ConsumerConfig(c.AckWait)
	base.InactiveThreshold = stream.CachedInfo().Config.MaxAge
	legacy, err := c.JS.Consumer(ctx, CommandsStream, legacyConsumer)
	switch {
	case err == nil:
		base.DeliverPolicy, base.OptStartSeq = jetstream.DeliverByStartSequencePolicy, legacy.CachedInfo().AckFloor.Stream+1
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("consumer %s on %s: %w", legacyConsumer, CommandsStream, err)
	}
	for _, tenant := range slices.Sorted(maps.Keys(c.Tenants)) {
		cfg := base
		cfg.Durable, cfg.FilterSubject = ConsumerFor(tenant), CommandPrefix+tenant+".>"
		cfg.Description = "order commands of tenant " + tenant + ", shared by every orderservice instance"
		cons, err := ensureConsumer(ctx, c.JS, cfg)
		if err != nil {
			return nil, err
		}
		lanes = append(lanes, lane{cons: cons, cfg: cfg})
	}
	if legacy != nil {
		err := c.JS.DeleteConsumer(ctx, CommandsStream, legacyConsumer)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("removing the single consumer %s of earlier versions: %w", legacyConsumer, err)
		}
		c.logger().Info("messaging: one consumer per tenant now, starting after what the single consumer of earlier versions acknowledged; it is removed",
			"consumer", legacyConsumer, "start_sequence", base.OptStartSeq)
	}
	return lanes, nil
}

// ensureConsumer creates the durable consumer cfg names, or updates the one
// there to cfg but for where it starts, which it keeps.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, CommandsStream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(ctx, CommandsStream, cfg)
		if errors.Is(err, jetstream.ErrConsumerExists) { // another instance was quicker, from another place
			cons, err = js.Consumer(ctx, CommandsStream, cfg.Durable)
		} else if err == nil {
			return cons, nil
		}
	}
	if err == nil {
		was := cons.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = was.DeliverPolicy, was.OptStartSeq, was.OptStartTime
		cons, err = js.UpdateConsumer(ctx, CommandsStream, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("durable consumer %s on %s: %w", cfg.Durable, CommandsStream, err)
	}
	return cons, nil
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
