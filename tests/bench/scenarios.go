package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// bench is one run: the database, the service under test, the clients
// that load it and what they measured.
type bench struct {
	opts   options
	dbURL  string
	log    io.Writer
	admin  *pgx.Conn // resets tables and counts rows; never under load
	svc    *app.Main
	client *http.Client // vegeta's client of the service, shared so warm-ups warm its connections
	keys   keys

	// channelURL is the embedded channel's own database, fresh for the run.
	channelURL  string
	dropChannel func()

	// bin is the service's own binary, built by serviceBinary into binDir.
	bin, binDir string
	// natsRoot holds every embedded NATS server's store, one directory per
	// service started (natsStores counts them); close removes it.
	natsRoot   string
	natsStores atomic.Int64
}

func newBench(ctx context.Context, opts options, dbURL string, log io.Writer) (*bench, error) {
	b := &bench{opts: opts, dbURL: dbURL, log: log}
	b.channelURL, b.dropChannel = testdb.NewURL("bench_channel")
	var err error
	if b.natsRoot, err = os.MkdirTemp("", "orderservice-bench-nats-"); err != nil {
		b.dropChannel()
		return nil, err
	}
	if b.admin, err = pgx.Connect(ctx, dbURL); err != nil {
		b.dropChannel()
		_ = os.RemoveAll(b.natsRoot)
		return nil, err
	}
	// One connection per storm copy may be open at once.
	transport := &http.Transport{MaxIdleConns: 0, MaxIdleConnsPerHost: max(opts.Storm, 256), IdleConnTimeout: time.Minute}
	b.client = &http.Client{Timeout: 30 * time.Second, Transport: transport}
	if b.svc, err = b.startService(ctx, opts.Pool, nil); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	if b.svc != nil {
		if err := b.svc.Close(); err != nil {
			fmt.Fprintln(b.log, "bench: close service:", err)
		}
		b.svc = nil
	}
	if b.dropChannel != nil {
		b.dropChannel()
		b.dropChannel = nil
	}
	b.client.CloseIdleConnections()
	for _, dir := range []string{b.binDir, b.natsRoot} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	if b.admin != nil {
		b.admin.Close(context.Background())
	}
}

// startService boots the real service in this process, as its tests do,
// with DB_MAX_CONNS pool and its defaults for everything else but extra.
func (b *bench) startService(ctx context.Context, pool int, extra map[string]string) (*app.Main, error) {
	cfg, err := app.LoadConfig(b.serviceEnv(pool, extra))
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(b.log, &slog.HandlerOptions{Level: slog.LevelError}))
	return app.Start(ctx, cfg, logger)
}

// restart replaces the service with one started with pool and extra.
func (b *bench) restart(ctx context.Context, pool int, extra map[string]string) error {
	if err := b.svc.Close(); err != nil {
		return err
	}
	b.svc = nil
	b.client.CloseIdleConnections()
	svc, err := b.startService(ctx, pool, extra)
	if err != nil {
		return err
	}
	b.svc = svc
	return nil
}

// serviceEnv is the service's environment in the bench: DB_MAX_CONNS pool
// and the defaults for everything else but extra.
func (b *bench) serviceEnv(pool int, extra map[string]string) map[string]string {
	env := map[string]string{
		"DATABASE_URL":         b.dbURL,
		"CHANNEL_DATABASE_URL": b.channelURL,
		"HTTP_ADDR":            "127.0.0.1:0",
		"CHANNEL_ADDR":         "127.0.0.1:0",
		"LOG_LEVEL":            "error",
		"API_KEYS":             benchTenant + "=" + benchAPIKey,
		"DB_MAX_CONNS":         strconv.Itoa(pool),
		// Only scenario 10 pays with pm_slow: long enough for a thousand
		// copies to be waiting before it finishes.
		"PAYMENT_SLOW_DELAY": "6s",
		// An embedded NATS server of its own, on a free port, with a store
		// of its own: services run side by side (scenario 12), and nothing
		// of an earlier run (a full run leaves hundreds of MB) is recovered.
		"NATS_EMBEDDED_ADDR": "127.0.0.1:0",
		"NATS_STORE_DIR":     filepath.Join(b.natsRoot, strconv.FormatInt(b.natsStores.Add(1), 10)),
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// reset empties the tables, so every measurement starts from the same
// table sizes, and checkpoints, so no checkpoint left over from the last
// measurement lands in the next one.
//
// The service keeps running meanwhile: its sweeper, relay and cleanup, and
// the last requests of the shot before, take these tables' locks in their
// own order, so TRUNCATE, which locks them in the order listed, may be
// chosen as a deadlock's victim (40P01): a rerun is the cure
// (database.Retryable, as database.Transact reruns the service's own).
func (b *bench) reset(ctx context.Context) error {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		_, err = b.admin.Exec(ctx, `TRUNCATE idempotency_records, idempotency_archive, orders, order_items, order_events, order_outbox, payments, webhook_inbox`)
		if !database.Retryable(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("reset tables: %w", err)
	}
	return b.checkpoint(ctx)
}

// checkpoint writes out what the last measurement left dirty, so that its
// checkpoint does not land in the next one.
func (b *bench) checkpoint(ctx context.Context) error {
	if b.opts.Quick { // a smoke test has no figures worth a checkpoint's wait
		return nil
	}
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// fire runs s, measuring the CPU of the backends serving this database.
func (b *bench) fire(ctx context.Context, s shot) point {
	s.backends = b.backendPIDs
	return s.fire(ctx)
}

// backendPIDs lists the PostgreSQL backends connected to the benchmark's
// database, but for the admin connection.
func (b *bench) backendPIDs() []int { return backendPIDs(b.admin) }

// backendPIDs lists the PostgreSQL backends connected to conn's database,
// but for conn's own.
func backendPIDs(conn *pgx.Conn) []int {
	rows, _ := conn.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

// connect opens one more connection to the benchmark's database.
func (b *bench) connect(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, b.dbURL) }

func (b *bench) count(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := b.admin.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

// measure resets, warms up with an unmeasured shot of the same kind,
// resets again and measures s.
func (b *bench) measure(ctx context.Context, s shot) (point, error) {
	if b.opts.Warmup > 0 {
		if err := b.reset(ctx); err != nil {
			return point{}, err
		}
		warm := s
		warm.name, warm.duration = s.name+"-warmup", b.opts.Warmup
		if w := b.fire(ctx, warm); w.Throughput == 0 && ctx.Err() == nil {
			return point{}, fmt.Errorf("%s: no request of the warm-up succeeded: %s %v", s.name, statuses(w), w.Errors)
		}
	}
	if err := b.reset(ctx); err != nil {
		return point{}, err
	}
	p := b.fire(ctx, s)
	return p, ctx.Err()
}

// results is everything one run measured.
type results struct {
	Opts    options
	Machine machine
	Levels  []createLevel
	// Scenario 3 at ReplayConc.
	First, Replay point
	Storm         stormResult
	// DirectReplayRead and DirectReplayTx are the replay over pgx: one
	// SELECT, or the write transaction the service used to run.
	DirectReplayRead, DirectReplayTx point
	Pay                              payResult
	Steady                           point
	Growth                           growthResult
	Overload                         overloadResult
	Messages                         messageResult
	Wait                             waitResult
	Webhooks                         webhookResult
	Tracing                          tracingResult
	Turns                            turnsResult
	Tenants                          tenantsResult
	Took                             time.Duration
	// Problems are failed assertions: the run reports them and fails.
	Problems []string
}

func (r *results) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

func (r *results) verdict() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return fmt.Errorf("%d assertion(s) failed: %s", len(r.Problems), strings.Join(r.Problems, "; "))
}

// createLevel is scenarios 1 and 2 at one concurrency.
type createLevel struct {
	Concurrency int
	Service     point // POST /v1/orders
	Direct      point // the same transaction over pgx, no HTTP
	Plain       point // the same order rows over pgx, without a record
	ClaimFirst  point // Direct with the record claimed first and completed last, as before Store.Record
	// DirectSize and ClaimFirstSize are the records table (heap, indexes)
	// right after the Direct and ClaimFirst points.
	DirectSize, ClaimFirstSize tableSize
	// Mixed is scenario 2's ratios measured by interleaving the pgx paths.
	Mixed interleaved
}

// tableSize is a table's heap and index bytes.
type tableSize struct{ Heap, Indexes int64 }

// size reads table's heap and index bytes.
func (b *bench) size(ctx context.Context, table string) (tableSize, error) {
	var ts tableSize
	err := b.admin.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass)`, table).Scan(&ts.Heap, &ts.Indexes)
	return ts, err
}

type stormResult struct {
	Copies      int
	Point       point
	Orders      int64
	Succeeded   int64 // records in SUCCEEDED
	Processing  int64 // records still PROCESSING after the drain
	WarmupDrain time.Duration
	// WarmupAnswers are the warm-up storm's answers: opening a thousand
	// connections at once spreads its arrivals, and the admission limit
	// may refuse some.
	WarmupAnswers string
}

type payResult struct {
	Concurrency int
	Pool        int
	Latency     time.Duration
	MaxInFlight int // the service's HTTP_MAX_IN_FLIGHT
	Point       point
	Charges     int64 // charges the channel made during the measurement
	Paid        int64 // orders PAID in the database after warm-up and measurement
	Prepared    int
}

// Bound is pool/latency: the pays per second a service that held a
// connection across the channel call could not exceed.
func (p payResult) Bound() float64 { return float64(p.Pool) / p.Latency.Seconds() }

type machine struct {
	CPUs       int
	CPUModel   string
	GoVersion  string
	PGVersion  string
	PGSettings string
	Date       time.Time
	Command    string
	// LoadBefore and LoadAfter are /proc/loadavg's 1-minute figure: a
	// machine busy with anything else makes every figure pessimistic.
	LoadBefore, LoadAfter string
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "n/a"
}

func (b *bench) describeMachine(ctx context.Context) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Date: time.Now().UTC(), Command: b.opts.command(),
		LoadBefore: loadAverage()}
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if err := b.admin.QueryRow(ctx, `SELECT version()`).Scan(&m.PGVersion); err != nil {
		return m, err
	}
	var settings []string
	for _, name := range []string{"shared_buffers", "synchronous_commit", "fsync", "wal_level", "wal_compression", "max_wal_size", "checkpoint_timeout", "max_connections"} {
		var v string
		if err := b.admin.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			return m, err
		}
		settings = append(settings, name+"="+v)
	}
	m.PGSettings = strings.Join(settings, ", ")
	return m, nil
}

// runAll measures every scenario. The overload uses scenario 1's capacity;
// the big tables are generated once, after every scenario that wants empty
// ones; the pay scenario restarts the service with its own pool, so it runs
// last. The report keeps the scenario order.
func (b *bench) runAll(ctx context.Context) (*results, error) {
	res := &results{Opts: b.opts}
	var err error
	if res.Machine, err = b.describeMachine(ctx); err != nil {
		return nil, err
	}
	if load, err := strconv.ParseFloat(res.Machine.LoadBefore, 64); err == nil && load >= 1 {
		b.progress("warning: load average %s at the start: the machine is not quiet, every figure will be pessimistic", res.Machine.LoadBefore)
	}
	steps := []struct {
		n    int
		name string
		run  func(context.Context, *results) error
	}{
		{1, "1+2 create: service, direct pgx with and without a record, the record claimed first", b.createLevels},
		{3, "3 replay vs first execution", b.replay},
		{4, "4 duplicate storm", b.storm},
		{6, "6 constant-rate create", b.steady},
		{8, "8 overload at three times capacity", b.overload},
		{14, "14 each tenant its share: a quiet tenant beside a flood, a bounded client", b.tenants},
		{7, "7 big tables", b.growth},
		{9, "9 creates as JetStream commands vs HTTP, and the outbox's lag", b.messages},
		{10, "10 duplicates waiting for one slow pay", b.waitScenario},
		{11, "11 webhooks: a first delivery against a duplicate", b.webhooks},
		{12, "12 what tracing costs", b.tracingCost},
		{13, "13 a quiet tenant's create behind another's backlog of commands", b.turns},
		{5, "5 pay with a slow channel", b.pay},
	}
	for _, s := range steps {
		if !b.opts.Runs(s.n) {
			continue
		}
		b.progress("scenario %s", s.name)
		if err := s.run(ctx, res); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.name, err)
		}
	}
	res.Machine.LoadAfter = loadAverage()
	return res, nil
}

// createLevels is scenarios 1 and 2: at each concurrency, creates through
// the service, the same transaction directly over pgx, the same order rows
// over pgx without a record, and the record claimed first and completed
// last, as the service wrote it before Store.Record.
func (b *bench) createLevels(ctx context.Context, res *results) error {
	cfg := b.svc.Config
	direct := map[directMode]*directCreate{}
	for _, mode := range []directMode{withRecord, withoutRecord, claimFirst} {
		d, err := newDirectCreate(ctx, b.dbURL, mode, cfg.Database.MaxConns, cfg.Recovery.Lease, cfg.Policy().RetentionFor(order.OpCreate),
			cfg.Database.StatementTimeout, cfg.Database.LockTimeout)
		if err != nil {
			return err
		}
		defer d.Close()
		direct[mode] = d
	}
	direct[oneTripWithRecord] = direct[withRecord].sharing(oneTripWithRecord)
	direct[oneTripWithoutRecord] = direct[withoutRecord].sharing(oneTripWithoutRecord)
	paths := map[directMode]*http.Client{}
	for mode, d := range direct {
		paths[mode] = &http.Client{Timeout: 30 * time.Second, Transport: d}
	}
	for _, c := range b.opts.Concurrency {
		lvl := createLevel{Concurrency: c}
		for _, x := range []struct {
			name   string
			client *http.Client
			url    string
			into   *point
			table  string
			size   *tableSize
		}{
			{"service", b.client, b.svc.URL() + "/v1/orders", &lvl.Service, "", nil},
			{"direct pgx", paths[withRecord], "http://direct.invalid/v1/orders", &lvl.Direct, "public.idempotency_records", &lvl.DirectSize},
			{"without a record", paths[withoutRecord], "http://direct.invalid/v1/orders", &lvl.Plain, "", nil},
			{"claim first", paths[claimFirst], "http://direct.invalid/v1/orders", &lvl.ClaimFirst, "public.idempotency_records", &lvl.ClaimFirstSize},
		} {
			p, err := b.measure(ctx, shot{name: x.name, client: x.client, workers: c,
				targeter: freshCreates(x.url, &b.keys), duration: b.opts.Duration})
			if err != nil {
				return err
			}
			*x.into = p
			if x.size != nil {
				if *x.size, err = b.size(ctx, x.table); err != nil {
					return err
				}
			}
			b.progress("  c=%-3d %-18s %8.0f req/s  p50 %-8s p99 %s", c, x.name, p.Throughput, ms(p.P50), ms(p.P99))
		}
		mixed, err := b.interleave(ctx, c, paths)
		if err != nil {
			return err
		}
		lvl.Mixed = mixed
		m := lvl.Mixed
		b.progress("  c=%-3d interleaved: loss %.1f %% (%.1f–%.1f), PostgreSQL CPU %.2f× (%.2f–%.2f); claim first: loss %.1f %%, %.2f×; one round trip: loss %.1f %%, %.2f×; WAL %.0f ÷ %.0f B",
			c, 100*m.Loss.Median, 100*m.Loss.Min, 100*m.Loss.Max, m.CPU.Median, m.CPU.Min, m.CPU.Max,
			100*m.ClaimLoss.Median, m.ClaimCPU.Median, 100*m.OneTripLoss.Median, m.OneTripCPU.Median, m.WALWith.Median, m.WALWithout.Median)
		res.Levels = append(res.Levels, lvl)
	}
	return nil
}

// interleaved is scenario 2's comparison as a machine that is not quiet
// needs it: rounds of one short slice of each pgx path, their order rotated
// every round, so that whatever else the machine does in a stretch of time
// hits every path alike. Each figure is per round (with ÷ without, over
// the same round's slices), summarised by the median and the range.
type interleaved struct {
	// Loss is 1 - with ÷ without, in throughput; CPU is with ÷ without, in
	// PostgreSQL CPU per create. ClaimLoss and ClaimCPU are the same for
	// claim first, OneTripLoss and OneTripCPU for the two paths sent as
	// one batch each (oneTripWithRecord ÷ oneTripWithoutRecord).
	Loss, CPU, ClaimLoss, ClaimCPU, OneTripLoss, OneTripCPU spread
	// WALWith and WALWithout are the WAL one create wrote, in bytes, with
	// and without a record (the statement-by-statement paths); WAL is
	// their ratio.
	WALWith, WALWithout, WAL spread
}

// spread is the median and range of one figure over the rounds.
type spread struct{ Median, Min, Max float64 }

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

// interleave measures scenario 2's ratios at concurrency c: Rounds rounds
// of one Slice of each path, from one reset (the tables grow alike for all).
// Before each slice the service's outbox relay has published every event
// the last one wrote, so that its work for one path does not count in the
// next. The WAL each slice wrote is the distance the server's WAL insert
// position moved meanwhile: the cluster's WAL, so it also holds what runs
// beside the path (the relay marking the slice's own events published,
// autovacuum).
func (b *bench) interleave(ctx context.Context, c int, paths map[directMode]*http.Client) (interleaved, error) {
	var mix interleaved
	if err := b.reset(ctx); err != nil {
		return mix, err
	}
	modes := []directMode{withRecord, withoutRecord, claimFirst, oneTripWithRecord, oneTripWithoutRecord}
	// A figure is one ratio or size per round, from the round's points and
	// the WAL per create of each path.
	type roundOf = func(round map[directMode]point, wal map[directMode]float64) float64
	lossOf := func(with, without directMode) roundOf {
		return func(round map[directMode]point, _ map[directMode]float64) float64 {
			return 1 - round[with].Throughput/round[without].Throughput
		}
	}
	cpuOf := func(with, without directMode) roundOf {
		return func(round map[directMode]point, _ map[directMode]float64) float64 {
			return pgPerRequest(round[with]) / pgPerRequest(round[without])
		}
	}
	walOf := func(m directMode) roundOf {
		return func(_ map[directMode]point, wal map[directMode]float64) float64 { return wal[m] }
	}
	figures := []struct {
		into   *spread
		of     roundOf
		rounds []float64
	}{
		{into: &mix.Loss, of: lossOf(withRecord, withoutRecord)},
		{into: &mix.CPU, of: cpuOf(withRecord, withoutRecord)},
		{into: &mix.ClaimLoss, of: lossOf(claimFirst, withoutRecord)},
		{into: &mix.ClaimCPU, of: cpuOf(claimFirst, withoutRecord)},
		{into: &mix.OneTripLoss, of: lossOf(oneTripWithRecord, oneTripWithoutRecord)},
		{into: &mix.OneTripCPU, of: cpuOf(oneTripWithRecord, oneTripWithoutRecord)},
		{into: &mix.WALWith, of: walOf(withRecord)},
		{into: &mix.WALWithout, of: walOf(withoutRecord)},
		{into: &mix.WAL, of: func(_ map[directMode]point, wal map[directMode]float64) float64 {
			return wal[withRecord] / wal[withoutRecord]
		}},
	}
	for r := range b.opts.Rounds {
		round, walPer := map[directMode]point{}, map[directMode]float64{}
		for k := range modes {
			m := modes[(k+r)%len(modes)]
			if err := b.waitFor(ctx, 10*time.Second, func(left int64) bool { return left == 0 },
				`SELECT count(*) FROM order_outbox WHERE published_at IS NULL`); err != nil {
				return mix, err
			}
			from, err := b.walPosition(ctx)
			if err != nil {
				return mix, err
			}
			round[m] = b.fire(ctx, shot{name: fmt.Sprintf("interleaved-%d", m), client: paths[m], workers: c,
				targeter: freshCreates("http://direct.invalid/v1/orders", &b.keys), duration: b.opts.Slice})
			if err := ctx.Err(); err != nil {
				return mix, err
			}
			to, err := b.walPosition(ctx)
			if err != nil {
				return mix, err
			}
			walPer[m] = float64(to-from) / float64(max(round[m].Requests, 1))
		}
		for _, base := range []directMode{withoutRecord, oneTripWithoutRecord} {
			if p := round[base]; p.Throughput == 0 || pgPerRequest(p) == 0 {
				return mix, fmt.Errorf("interleaved round %d at c=%d: a path without a record measured nothing: %s", r+1, c, statuses(p))
			}
		}
		for i := range figures {
			figures[i].rounds = append(figures[i].rounds, figures[i].of(round, walPer))
		}
	}
	for _, f := range figures {
		*f.into = spreadOf(f.rounds)
	}
	return mix, nil
}

// walPosition is the server's WAL insert position, in bytes.
func (b *bench) walPosition(ctx context.Context) (int64, error) {
	var lsn int64
	err := b.admin.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::int8`).Scan(&lsn)
	return lsn, err
}

// replay is scenario 3: fresh creates at ReplayConc, then one request
// replayed at the same concurrency. Every replay must be the first
// response, byte for byte, with Idempotent-Replayed: true.
func (b *bench) replay(ctx context.Context, res *results) error {
	c := b.opts.ReplayConc
	url := b.svc.URL() + "/v1/orders"
	var err error
	if res.First, err = b.measure(ctx, shot{name: "first-execution", client: b.client, workers: c,
		targeter: freshCreates(url, &b.keys), duration: b.opts.Duration}); err != nil {
		return err
	}
	b.progress("  c=%-3d first execution      %8.0f req/s  p50 %-8s p99 %s", c, res.First.Throughput, ms(res.First.P50), ms(res.First.P99))

	if err := b.reset(ctx); err != nil {
		return err
	}
	key, n := b.keys.next()
	body, err := json.Marshal(newCreate(n))
	if err != nil {
		return err
	}
	first, err := b.send(ctx, url, key, body)
	if err != nil {
		return err
	}
	if first.status != http.StatusCreated {
		return fmt.Errorf("the request to replay got %d, not 201: %s", first.status, first.body)
	}
	s := shot{name: "replay", client: b.client, workers: c, targeter: sameRequest(url, key, body), keepBody: true}
	if b.opts.Warmup > 0 {
		s.duration = b.opts.Warmup
		b.fire(ctx, s)
	}
	s.duration = b.opts.Duration
	res.Replay = b.fire(ctx, s)
	if err := ctx.Err(); err != nil {
		return err
	}
	b.progress("  c=%-3d replay               %8.0f req/s  p50 %-8s p99 %s", c, res.Replay.Throughput, ms(res.Replay.P50), ms(res.Replay.P99))

	// The same replay over pgx: one SELECT (what the service does now),
	// and the write transaction it ran before Store.Replay.
	cfg := b.svc.Config
	for _, x := range []struct {
		mode directMode
		into *point
		name string
	}{{replayRead, &res.DirectReplayRead, "replay by one read"}, {replayTx, &res.DirectReplayTx, "replay in a transaction"}} {
		d, err := newDirectCreate(ctx, b.dbURL, x.mode, cfg.Database.MaxConns, cfg.Recovery.Lease, cfg.Policy().RetentionFor(order.OpCreate),
			cfg.Database.StatementTimeout, cfg.Database.LockTimeout)
		if err != nil {
			return err
		}
		ds := shot{name: x.name, client: &http.Client{Timeout: 30 * time.Second, Transport: d}, workers: c,
			targeter: sameRequest("http://direct.invalid/v1/orders", key, body)}
		if b.opts.Warmup > 0 {
			ds.duration = b.opts.Warmup
			b.fire(ctx, ds)
		}
		ds.duration = b.opts.Duration
		*x.into = b.fire(ctx, ds)
		d.Close()
		if err := ctx.Err(); err != nil {
			return err
		}
		if u := unexpected(*x.into, http.StatusCreated); u != "" {
			res.fail("%s over pgx: %s", x.name, u)
		}
		b.progress("  c=%-3d %-22s %8.0f req/s  p50 %-8s p99 %s", c, x.name+" (pgx)", x.into.Throughput, ms(x.into.P50), ms(x.into.P99))
	}

	p := res.Replay
	if p.ok(http.StatusCreated) != int(p.Requests) || p.Replayed != int(p.Requests) {
		res.fail("replay: %d requests, %d answered 201, %d marked Idempotent-Replayed", p.Requests, p.ok(http.StatusCreated), p.Replayed)
	}
	if len(p.Bodies) != 1 || p.Bodies[sha256.Sum256(first.body)] != int(p.Requests) {
		res.fail("replay: %d distinct 201 bodies, %d equal to the first response", len(p.Bodies), p.Bodies[sha256.Sum256(first.body)])
	}
	if orders, err := b.count(ctx, `SELECT count(*) FROM orders`); err != nil {
		return err
	} else if orders != 1 {
		res.fail("replay: %d orders after replaying one request, want 1", orders)
	}
	return nil
}

type answer struct {
	status int
	body   []byte
}

// send is one request outside any measurement.
func (b *bench) send(ctx context.Context, url, key string, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header = header(key)
	resp, err := b.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: got}, err
}

// admissionMemory is a little more than how long the service's admission
// limit refuses at once after a sign of overload.
const admissionMemory = httpapi.CongestedFor + 100*time.Millisecond

// storm is scenario 4: Storm copies of one request (one key, one body)
// fired at once by as many vegeta workers, exactly Storm hits. A first,
// unmeasured storm on another key opens the connections.
func (b *bench) storm(ctx context.Context, res *results) error {
	n := b.opts.Storm
	url := b.svc.URL() + "/v1/orders"
	res.Storm.Copies = n
	for _, measured := range []bool{false, true} {
		if err := b.reset(ctx); err != nil {
			return err
		}
		key, seq := b.keys.next()
		body, err := json.Marshal(newCreate(seq))
		if err != nil {
			return err
		}
		p := b.fire(ctx, shot{name: "storm", client: b.client, workers: n, hits: n, targeter: sameRequest(url, key, body), keepBody: true})
		if err := ctx.Err(); err != nil {
			return err
		}
		orders, err := b.count(ctx, `SELECT count(*) FROM orders`)
		if err != nil {
			return err
		}
		label := "warm-up storm"
		if measured {
			label = "storm"
		}
		if orders != 1 {
			res.fail("%s: %d copies of one request created %d orders, want exactly 1", label, n, orders)
		}
		if int(p.Requests) != n {
			res.fail("%s: vegeta sent %d requests, want %d", label, p.Requests, n)
		}
		if len(p.Bodies) > 1 {
			res.fail("%s: %d distinct 201 bodies, want 1", label, len(p.Bodies))
		}
		if !measured {
			res.Storm.WarmupDrain, res.Storm.WarmupAnswers = p.Drain, statuses(p)
			// A refusal makes the admission limit refuse at once, rather than
			// queue, for httpapi.CongestedFor: let that pass, so the
			// measured storm meets the service as a storm out of the blue would.
			select {
			case <-time.After(admissionMemory):
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		res.Storm.Point, res.Storm.Orders = p, orders
		if res.Storm.Succeeded, err = b.count(ctx, `SELECT count(*) FROM idempotency_records WHERE state = 'SUCCEEDED'`); err != nil {
			return err
		}
		if res.Storm.Processing, err = b.count(ctx, `SELECT count(*) FROM idempotency_records WHERE state = 'PROCESSING'`); err != nil {
			return err
		}
		b.progress("  %d copies drained in %s: %s, %d order(s)", n, ms(p.Drain), statuses(p), orders)
	}
	return nil
}

// steady is scenario 6: creates at a constant rate, for latency figures
// that a closed loop's queueing does not distort.
func (b *bench) steady(ctx context.Context, res *results) error {
	s := shot{name: "constant-rate", client: b.client, rate: rate(b.opts.Rate),
		targeter: freshCreates(b.svc.URL()+"/v1/orders", &b.keys), duration: b.opts.RateDuration}
	var err error
	if res.Steady, err = b.measure(ctx, s); err != nil {
		return err
	}
	b.progress("  %d/s for %s: p50 %s p90 %s p99 %s max %s", b.opts.Rate, b.opts.RateDuration,
		ms(res.Steady.P50), ms(res.Steady.P90), ms(res.Steady.P99), ms(res.Steady.Max))
	return nil
}

// pay is scenario 5: the service restarted with DB_MAX_CONNS=PayPool, the
// channel adding PayLatency to every call, PayConc pays in flight, each on
// its own order with its own key.
func (b *bench) pay(ctx context.Context, res *results) error {
	o := b.opts
	if err := b.svc.Close(); err != nil {
		return err
	}
	b.svc = nil
	b.client.CloseIdleConnections()
	svc, err := b.startService(ctx, o.PayPool, nil)
	if err != nil {
		return err
	}
	b.svc = svc
	if err := svc.Channel.SetFaults(mockchannel.Faults{LatencyMS: int(o.PayLatency.Milliseconds())}); err != nil {
		return err
	}
	defer func() { _ = svc.Channel.SetFaults(mockchannel.Faults{}) }()

	if err := b.reset(ctx); err != nil {
		return err
	}
	// Every pay takes at least the channel's latency, so PayConc workers
	// cannot pay more than PayConc/latency orders a second.
	prepared := int(math.Ceil(float64(o.PayConc)/o.PayLatency.Seconds()*(o.Warmup+o.Duration).Seconds()*1.1)) + o.PayConc
	ids, err := b.prepareOrders(ctx, prepared)
	if err != nil {
		return err
	}
	s := shot{name: "pay", client: b.client, workers: o.PayConc, targeter: pays(svc.URL(), ids, payment.MethodOK, &b.keys)}
	warm := 0
	if o.Warmup > 0 {
		s.duration = o.Warmup
		warm = b.fire(ctx, s).ok(http.StatusOK)
	}
	before := svc.Channel.Stats()
	s.duration = o.Duration
	p := b.fire(ctx, s)
	if err := ctx.Err(); err != nil {
		return err
	}
	after := svc.Channel.Stats()

	res.Pay = payResult{Concurrency: o.PayConc, Pool: o.PayPool, Latency: o.PayLatency, MaxInFlight: svc.Config.HTTP.MaxInFlight, Point: p,
		Charges: after.Charges - before.Charges, Prepared: prepared}
	if res.Pay.Paid, err = b.count(ctx, `SELECT count(*) FROM orders WHERE status = 'PAID'`); err != nil {
		return err
	}
	if res.Pay.Charges != int64(p.ok(http.StatusOK)) {
		res.fail("pay: %d pays answered 200 but the channel made %d charges", p.ok(http.StatusOK), res.Pay.Charges)
	}
	if res.Pay.Paid != int64(warm+p.ok(http.StatusOK)) {
		res.fail("pay: %d pays answered 200 (warm-up included) but %d orders are PAID", warm+p.ok(http.StatusOK), res.Pay.Paid)
	}
	b.progress("  c=%d pool=%d latency=%s: %.0f pays/s (bound %.0f/s), p50 %s p99 %s, %s", o.PayConc, o.PayPool, o.PayLatency,
		p.Throughput, res.Pay.Bound(), ms(p.P50), ms(p.P99), statuses(p))
	return nil
}

// prepareOrders inserts n CREATED orders of one item each, in one
// statement: the pay scenario measures pays, not creates.
func (b *bench) prepareOrders(ctx context.Context, n int) ([]string, error) {
	rows, _ := b.admin.Query(ctx, `
		WITH o AS (
			INSERT INTO orders (id, tenant_id, customer_id, status, currency, total_amount, metadata, version, created_at, updated_at)
			SELECT gen_random_uuid(), $1, 'pay-cust-' || g, 'CREATED', 'EUR', 2500, '{}', 1, now(), now()
			FROM generate_series(1, $2::int) g
			RETURNING id)
		INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price, line_total)
		SELECT id, 1, 'SKU-PAY', 1, 2500, 2500 FROM o
		RETURNING order_id::text`, benchTenant, n)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("prepare orders to pay: %w", err)
	}
	if _, err := b.admin.Exec(ctx, `ANALYZE orders, order_items`); err != nil {
		return nil, err
	}
	return ids, nil
}
