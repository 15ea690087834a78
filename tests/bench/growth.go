package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
)

// growthResult is scenario 7: the same creates on empty and on big tables,
// the metrics scrape on both, and the cleanup job while creates run.
type growthResult struct {
	Records, Orders, Expired int64
	// Generated is how long the big tables took to generate (and analyze).
	Generated  time.Duration
	TableBytes int64 // records table with indexes, once generated
	Empty, Big point // closed loop at ReplayConc, fresh creates
	// ScrapeEmpty and ScrapeBig are the median GET /metrics of the service;
	// OldGauges is the SQL the metrics ran up to now, once, on the big table.
	ScrapeEmpty, ScrapeBig, OldGauges time.Duration
	Scrapes                           int
	// Cleanup: the cleanup job against the expired records while creates
	// run at CleanupRate, in Phases phases of Phase: with the service's
	// CLEANUP_BATCH and CLEANUP_PAUSE (Cleanup), and before that with the
	// defaults they had before (CleanupBefore), each on its own share of
	// the expired records; last, the service's settings again with the
	// job's sessions compressing the full-page images they log
	// (CleanupCompressed).
	CleanupRate                               int
	Phase                                     time.Duration
	Phases                                    int
	CleanupBefore, Cleanup, CleanupCompressed cleanupRun
}

// cleanupRun is the cleanup job at one batch size and pause, in every
// other phase while creates run throughout; Quiet and During are the
// creates sent in the phases without and with it, Took the time it ran.
type cleanupRun struct {
	Name  string // which setting it is, as the report names it
	Batch int
	Pause time.Duration
	// WALCompression is the wal_compression of the job's own sessions
	// (the service's pool, at the server's setting, when empty).
	WALCompression string
	// WAL is how much WAL the whole cluster wrote during the run, creates
	// included.
	WAL           int64
	Cleaned       idempotency.CleanupResult
	Took          time.Duration
	Quiet, During point
	Err           string
	// RefusedIn is in how many windows of refusalWindow (by send time) a
	// create was refused: a few windows with many 503s each are stalls of
	// every request at once, not a steady overload.
	RefusedIn int
	// RefusedDuring is how many of those windows fell in a phase with the
	// cleanup job.
	RefusedDuring int
	// Paired is the creates' p99 phase by phase: each phase with the job
	// ÷ the phase without it right after, over the pairs.
	Paired spread
	// Checkpoints is how many checkpoints PostgreSQL completed while this
	// setting's phases ran, and CheckpointSync the time their sync phases
	// took (pg_stat_bgwriter).
	Checkpoints    int64
	CheckpointSync time.Duration
	// WALWaitRefused and WALWaitOther are the share of the service's active
	// sessions that were waiting for the WAL to be written or flushed
	// (wait events WALWrite, WALSync), sampled every walSampleEvery, in the
	// windows with a 503 and in the others.
	WALWaitRefused, WALWaitOther float64
}

// walSampleEvery is how often cleanupPhases samples pg_stat_activity.
const walSampleEvery = 10 * time.Millisecond

// walSample is one look at the service's active sessions.
type walSample struct {
	at                 time.Time
	waitingWAL, active int
}

// sampleWAL samples until ctx ends how many of the service's sessions are
// active and how many of those wait for the WAL, on a connection of its own.
func (b *bench) sampleWAL(ctx context.Context) ([]walSample, error) {
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var samples []walSample
	t := time.NewTicker(walSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return samples, nil
		case <-t.C:
		}
		s := walSample{at: time.Now()}
		err := conn.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE wait_event IN ('WALWrite', 'WALSync')), count(*)
			FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND state = 'active'
			  AND pid <> pg_backend_pid()`).Scan(&s.waitingWAL, &s.active)
		if err != nil {
			if ctx.Err() != nil {
				return samples, nil
			}
			return samples, err
		}
		samples = append(samples, s)
	}
}

// refusalWindow is the width of the windows RefusedIn counts.
const refusalWindow = 100 * time.Millisecond

// The cleanup settings before issue 15 measured them (CLEANUP_BATCH,
// CLEANUP_PAUSE): the "before" of the pair scenario 7 measures.
const (
	cleanupBatchBefore = 500
	cleanupPauseBefore = 15 * time.Millisecond
)

// PerSecond is the job's rate while creates ran.
func (c cleanupRun) PerSecond() float64 {
	if c.Took <= 0 {
		return 0
	}
	return float64(c.Cleaned.Deleted) / c.Took.Seconds()
}

// P99Up is how much higher the creates' p99 was in the phases with the
// job than in those without it (0.25 is 25 % higher).
func (c cleanupRun) P99Up() float64 {
	return float64(c.During.P99)/max(float64(c.Quiet.P99), 1) - 1
}

// PairedP99Up is the same, phase by phase: the median of Paired.
func (c cleanupRun) PairedP99Up() float64 { return c.Paired.Median - 1 }

// Refused counts the creates answered 503, with the job and without it.
func (c cleanupRun) Refused() int {
	return c.Quiet.ok(http.StatusServiceUnavailable) + c.During.ok(http.StatusServiceUnavailable)
}

// Settings are the cleanup runs in the order they ran.
func (g growthResult) Settings() []cleanupRun {
	return []cleanupRun{g.CleanupBefore, g.Cleanup, g.CleanupCompressed}
}

// Pairs is how many ratios Paired summarises: one per phase with the job.
func (g growthResult) Pairs() int { return g.Phases / 2 }

// Windows is how many windows of refusalWindow the phases span.
func (g growthResult) Windows() int { return int(time.Duration(g.Phases) * g.Phase / refusalWindow) }

// summarise is the point of the samples that keep selects: their count,
// latency quantiles and answers.
func summarise(samples []sample, keep func(sample) bool) point {
	p := point{Statuses: map[string]int{}}
	var latencies []time.Duration
	for _, s := range samples {
		if !keep(s) {
			continue
		}
		p.Requests++
		latencies = append(latencies, s.Latency)
		p.Statuses[strconv.Itoa(int(s.Code))]++
	}
	p.setLatencies(latencies)
	return p
}

// growth is scenario 7.
func (b *bench) growth(ctx context.Context, res *results) error {
	o := b.opts
	g := &res.Growth
	g.Records, g.Orders = int64(o.BigRecords), int64(o.BigOrders)
	url := b.svc.URL() + "/v1/orders"
	var err error
	if g.Empty, err = b.measure(ctx, shot{name: "create-empty", client: b.client, workers: o.ReplayConc,
		targeter: freshCreates(url, &b.keys), duration: o.Duration}); err != nil {
		return err
	}
	b.progress("  c=%-3d empty tables %8.0f req/s  p50 %-8s p99 %s", o.ReplayConc, g.Empty.Throughput, ms(g.Empty.P50), ms(g.Empty.P99))
	if g.ScrapeEmpty, err = b.scrape(ctx, &g.Scrapes); err != nil {
		return err
	}

	if err := b.reset(ctx); err != nil {
		return err
	}
	b.progress("  generating %d records and %d orders in SQL", o.BigRecords, o.BigOrders)
	began := time.Now()
	if g.Expired, err = b.generate(ctx, o.BigRecords, o.BigOrders); err != nil {
		return err
	}
	g.Generated = time.Since(began).Round(time.Second)
	if err := b.admin.QueryRow(ctx, `SELECT pg_total_relation_size('idempotency_records')`).Scan(&g.TableBytes); err != nil {
		return err
	}
	b.progress("  generated in %s (%s of records)", g.Generated, megabytes(g.TableBytes))

	// The stored rows stay: no reset before these measurements.
	warm := shot{name: "create-big-warmup", client: b.client, workers: o.ReplayConc, targeter: freshCreates(url, &b.keys), duration: o.Warmup}
	if o.Warmup > 0 {
		b.fire(ctx, warm)
	}
	g.Big = b.fire(ctx, shot{name: "create-big", client: b.client, workers: o.ReplayConc, targeter: freshCreates(url, &b.keys), duration: o.Duration})
	if err := ctx.Err(); err != nil {
		return err
	}
	b.progress("  c=%-3d big tables   %8.0f req/s  p50 %-8s p99 %s", o.ReplayConc, g.Big.Throughput, ms(g.Big.P50), ms(g.Big.P99))
	if g.ScrapeBig, err = b.scrape(ctx, &g.Scrapes); err != nil {
		return err
	}
	if g.OldGauges, err = b.oldGauges(ctx); err != nil {
		return err
	}
	b.progress("  /metrics: %s empty, %s big; the old gauge SQL: %s", ms(g.ScrapeEmpty), ms(g.ScrapeBig), ms(g.OldGauges))

	// The cleanup job against the expired share, while creates run at a
	// constant rate: in alternate phases with and without it, so that the
	// two halves are measured over the same stretch of time; first at the
	// settings of before, then at the service's, then at the service's with
	// the job's sessions compressing the full-page images they log.
	g.CleanupRate = max(1, int(g.Big.Throughput/2))
	g.Phase = o.Duration / 10
	g.Phases = 20 // after phase 0, while the load opens its connections, which counts for neither
	cfg := b.svc.Config
	const compression = "lz4"
	for _, run := range []struct {
		into    *cleanupRun
		setting cleanupRun
	}{
		{&g.CleanupBefore, cleanupRun{Name: "before", Batch: cleanupBatchBefore, Pause: cleanupPauseBefore}},
		{&g.Cleanup, cleanupRun{Name: "the service's", Batch: cfg.Cleanup.Batch, Pause: cfg.Cleanup.Pause}},
		{&g.CleanupCompressed, cleanupRun{Name: "the service's, wal_compression=" + compression, Batch: cfg.Cleanup.Batch, Pause: cfg.Cleanup.Pause,
			WALCompression: compression}},
	} {
		*run.into = b.cleanupPhases(ctx, url, g, run.setting)
		c := *run.into
		if c.Err != "" {
			res.fail("cleanup during creates: %s", c.Err)
		}
		b.progress("  cleanup (batch %d, pause %s, wal_compression %s): %d deleted (%d archived) in %s = %.0f/s, %d MB of WAL; creates at %d/s p99 %s quiet, %s during cleanup",
			c.Batch, c.Pause, cmp.Or(c.WALCompression, "of the server"), c.Cleaned.Deleted, c.Cleaned.Archived, c.Took.Round(time.Millisecond), c.PerSecond(),
			c.WAL>>20, g.CleanupRate, ms(c.Quiet.P99), ms(c.During.P99))
		b.progress("  phase by phase p99 %s; 503s in %d windows, %d of them with the job", timesSpread(c.Paired), c.RefusedIn, c.RefusedDuring)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// cleanupPhases runs the service's cleanup job with c's batch and pause in
// the odd phases of g while creates run at g.CleanupRate through all of
// them. With a WALCompression, the job runs on two connections of its own
// that set it (as ALTER ROLE … SET would for a role of the job's own); the
// creates keep the server's setting.
func (b *bench) cleanupPhases(ctx context.Context, url string, g *growthResult, c cleanupRun) cleanupRun {
	db := b.svc.DB
	if c.WALCompression != "" {
		cfg := b.svc.Config
		own, err := openWithSetting(ctx, b.dbURL, database.Options{MaxConns: 2,
			StatementTimeout: cfg.Database.StatementTimeout, LockTimeout: cfg.Database.LockTimeout}, "wal_compression", c.WALCompression)
		if err != nil {
			c.Err = err.Error()
			return c
		}
		defer database.Close(own)
		db = own
	}
	cleaner := &idempotency.Cleaner{DB: db, Store: b.svc.Orders.Records, Batch: c.Batch, Pause: c.Pause, Logger: b.svc.Logger}
	// The admin connection before and after, never while the load measures
	// the CPU with it. Each setting starts after a checkpoint, so that the
	// pages it changes first log whole for every setting alike.
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		c.Err = err.Error()
		return c
	}
	checkpoints, synced, err := b.checkpoints(ctx)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	walFrom, err := b.walPosition(ctx)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	start := time.Now()
	var eg errgroup.Group
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var walSamples []walSample
	var walErr error
	eg.Go(func() error {
		walSamples, walErr = b.sampleWAL(sampling)
		return nil
	})
	eg.Go(func() error {
		defer stopSampling()
		for i := range g.Phases + 1 {
			end := start.Add(time.Duration(i+1) * g.Phase)
			if i%2 == 1 { // the odd phases clean up; phase 0 and the other even ones do not
				pctx, cancel := context.WithDeadline(ctx, end)
				began := time.Now()
				r, err := cleaner.Pass(pctx)
				cancel()
				c.Cleaned.Deleted += r.Deleted
				c.Cleaned.Archived += r.Archived
				if err != nil && pctx.Err() == nil {
					c.Err = err.Error()
					return nil
				}
				// A pass that ran out of expired records ends early; the rest of
				// the phase has no cleanup either way.
				c.Took += time.Since(began)
			}
			select {
			case <-time.After(time.Until(end)):
			case <-ctx.Done():
			}
		}
		return nil
	})
	creates := b.fire(ctx, shot{name: "create-cleanup-phases", client: b.client, rate: rate(g.CleanupRate),
		targeter: freshCreates(url, &b.keys), duration: time.Duration(g.Phases+1) * g.Phase, keepSamples: true})
	_ = eg.Wait()
	phase := func(at time.Time) int { return int(at.Sub(start) / g.Phase) }
	c.Quiet = summarise(creates.Samples, func(s sample) bool { p := phase(s.At); return p > 0 && p%2 == 0 })
	c.During = summarise(creates.Samples, func(s sample) bool { return phase(s.At)%2 == 1 })
	counted := start.Add(g.Phase) // phase 0 counts for neither
	refused := refusedWindows(creates.Samples, start, counted)
	c.RefusedIn = len(refused)
	for w := range refused {
		c.RefusedDuring += btoi(phase(start.Add(w*refusalWindow))%2 == 1)
	}
	c.Paired = pairedP99(creates.Samples, start, g.Phase, g.Phases)
	c.WALWaitRefused, c.WALWaitOther = walShares(walSamples, refused, start, counted)
	after, syncedAfter, err := b.checkpoints(ctx)
	c.Checkpoints, c.CheckpointSync = after-checkpoints, syncedAfter-synced
	walTo, walPosErr := b.walPosition(ctx)
	if walPosErr == nil {
		c.WAL = walTo - walFrom
	}
	for _, err := range []error{walErr, err, walPosErr} {
		if err != nil && c.Err == "" {
			c.Err = err.Error()
		}
	}
	return c
}

// refusedWindows is the set of windows of refusalWindow, numbered from
// start, in which a create sent from counted on was refused with 503.
func refusedWindows(samples []sample, start, counted time.Time) map[time.Duration]bool {
	windows := map[time.Duration]bool{}
	for _, s := range samples {
		if s.Code == http.StatusServiceUnavailable && !s.At.Before(counted) {
			windows[s.At.Sub(start)/refusalWindow] = true
		}
	}
	return windows
}

// pairedP99 compares the creates' p99 phase by phase, as scenario 2
// interleaves its paths: each odd phase (with the cleanup job) ÷ the even
// one right after it (without), from phase 1 to phases. A stall that hits
// one phase moves one ratio, not the whole figure.
func pairedP99(samples []sample, start time.Time, phase time.Duration, phases int) spread {
	byPhase := make([][]time.Duration, phases+1)
	for _, s := range samples {
		if p := int(s.At.Sub(start) / phase); s.At.After(start) && p <= phases {
			byPhase[p] = append(byPhase[p], s.Latency)
		}
	}
	var ratios []float64
	for p := 1; p+1 <= phases; p += 2 {
		during, quiet := byPhase[p], byPhase[p+1]
		if len(during) == 0 || len(quiet) == 0 {
			continue
		}
		slices.Sort(during)
		slices.Sort(quiet)
		ratios = append(ratios, float64(quantile(during, 0.99))/float64(quantile(quiet, 0.99)))
	}
	return spreadOf(ratios)
}

// walShares is the share of the active sessions sampled from counted on
// that were waiting for the WAL, in the refused windows and in the others.
func walShares(samples []walSample, refused map[time.Duration]bool, start, counted time.Time) (inRefused, elsewhere float64) {
	var wal, active [2]int // [elsewhere, in a refused window]
	for _, s := range samples {
		if !s.at.Before(counted) {
			i := btoi(refused[s.at.Sub(start)/refusalWindow])
			wal[i] += s.waitingWAL
			active[i] += s.active
		}
	}
	return float64(wal[1]) / float64(max(active[1], 1)), float64(wal[0]) / float64(max(active[0], 1))
}

// checkpoints is how many checkpoints PostgreSQL has completed, and how
// long their sync phases took in all.
func (b *bench) checkpoints(ctx context.Context) (n int64, synced time.Duration, err error) {
	var ms float64
	err = b.admin.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req, checkpoint_sync_time FROM pg_stat_bgwriter`).Scan(&n, &ms)
	return n, time.Duration(ms * float64(time.Millisecond)), err
}

// generate fills the tables of the benchmark's database in SQL: records
// finished records (a quarter of them order.pay, which the cleanup
// archives; the oldest tenth expired), and orders orders with two items and their
// create event, all in another tenant than the load's. Three statements run
// at once on their own connections; then everything is analyzed and
// checkpointed. It returns how many records are expired.
func (b *bench) generate(ctx context.Context, records, orders int) (expired int64, err error) {
	half := records / 2
	stmts := []string{
		genRecords(1, half, records/10),
		genRecords(half+1, records, records/10),
		fmt.Sprintf(`
			WITH o AS (
				INSERT INTO orders (id, tenant_id, customer_id, status, currency, total_amount, metadata, version, created_at, updated_at)
				SELECT gen_random_uuid(), 'grow', 'cust-' || (g %% 5000), 'CREATED', 'EUR', 2250, '{}', 1, now(), now()
				FROM generate_series(1, %d) g
				RETURNING id, created_at),
			i AS (
				INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price, line_total)
				SELECT id, n, 'SKU-' || n, 1, 1000 + n, 1000 + n FROM o, generate_series(1, 2) n)
			INSERT INTO order_events (order_id, event, operation, idempotency_key, from_status, to_status, created_at)
			SELECT id, 'create', 'order.create', 'grow-' || id, '', 'CREATED', created_at FROM o`, orders),
	}
	var eg errgroup.Group
	for _, q := range stmts {
		eg.Go(func() error {
			conn, err := b.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			_, err = conn.Exec(ctx, q)
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		return 0, fmt.Errorf("generate: %w", err)
	}
	if _, err := b.admin.Exec(ctx, `ANALYZE idempotency_records, orders, order_items, order_events`); err != nil {
		return 0, err
	}
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return 0, err
	}
	return int64(records / 10), nil
}

// genRecords is the INSERT of records from to to (inclusive): the row a
// create or a pay leaves when it succeeds, with a stored response the size
// of an order's JSON. Records up to expired have expired: the oldest ones,
// written first, as in a table whose records were written in the order of
// time and expire after one retention.
func genRecords(from, to, expired int) string {
	return fmt.Sprintf(`
		INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, state, resource_id,
			outcome, result_code, result_body, lease_token, lease_expires_at,
			attempts, created_at, updated_at, completed_at, expires_at, resumable)
		SELECT 'grow', CASE WHEN g %% 4 = 0 THEN 'order.pay' ELSE 'order.create' END, 'grow-' || g, lpad(to_hex(g), 64, '0'),
		       'SUCCEEDED', NULL, 'created', NULL, convert_to(repeat('x', 450), 'UTF8'), 1,
		       NULL, 1,
		       now() - interval '40 days', now() - interval '40 days', now() - interval '40 days',
		       CASE WHEN g <= %d THEN now() - interval '1 day' ELSE now() + interval '1 day' END, g %% 4 = 0
		FROM generate_series(%d, %d) g`, expired, from, to)
}

// scrape is the median of GET /metrics over a few scrapes.
func (b *bench) scrape(ctx context.Context, n *int) (time.Duration, error) {
	const scrapes = 9
	*n = scrapes
	took := make([]time.Duration, scrapes)
	for i := range took {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.svc.URL()+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		resp, err := b.client.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took[i] = time.Since(start)
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET /metrics: %d %v", resp.StatusCode, err)
		}
	}
	slices.Sort(took)
	return took[scrapes/2], nil
}

// oldGauges runs, once, the five statements the metrics ran at every
// scrape up to this change.
func (b *bench) oldGauges(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	for _, q := range []string{
		"SELECT state, count(*) AS n FROM idempotency_records GROUP BY state",
		"SELECT count(*) FROM idempotency_records WHERE state = 'PROCESSING' AND lease_expires_at < now()",
		"SELECT count(*) FROM idempotency_records WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE') AND attempts >= 5",
		"SELECT pg_total_relation_size('idempotency_records')",
		"SELECT count(*) FROM idempotency_archive",
	} {
		rows, err := b.admin.Query(ctx, q)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// openWithSetting opens a pool to dbURL, as the service opens its own,
// whose sessions start with the server setting name at value (a pgx
// runtime parameter), and checks that they have it.
func openWithSetting(ctx context.Context, dbURL string, opts database.Options, name, value string) (*gorm.DB, error) {
	u, err := neturl.Parse(dbURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	db, err := database.Open(ctx, u.String(), opts)
	if err != nil {
		return nil, err
	}
	var got string
	if err := db.Raw(`SELECT current_setting(?)`, name).Row().Scan(&got); err != nil || got != value {
		database.Close(db)
		return nil, fmt.Errorf("a session opened with %s=%s has %s=%q (%v)", name, value, name, got, err)
	}
	return db, nil
}
