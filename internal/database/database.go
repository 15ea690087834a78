// Package database opens PostgreSQL through GORM over pgx, applies the
// embedded migrations, and runs transactions with the one retry policy the
// service has.
package database

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Options tunes the pool and the server-side timeouts of every connection.
type Options struct {
	MaxConns         int
	StatementTimeout time.Duration
	// LockTimeout bounds how long a duplicate waits for the first request's
	// transaction before it is answered 409 request_in_progress.
	LockTimeout time.Duration
	// ApplicationName labels the connections in pg_stat_activity; empty is "orderservice".
	ApplicationName string
	// ConnMaxLifetime bounds how long a pooled connection lives. A
	// multi-host URL picks its server only when a connection is made, so
	// this bounds how long the pool can stay on a server the URL would no
	// longer choose (behind a proxy or a moved address). Zero means
	// DefaultConnMaxLifetime.
	ConnMaxLifetime time.Duration
}

// DefaultConnMaxLifetime is the ConnMaxLifetime of a zero Options field.
const DefaultConnMaxLifetime = 2 * time.Minute

// defaultConnectTimeout bounds one connection attempt when the URL does not
// (connect_timeout): a host that swallows packets must not hold a request.
const defaultConnectTimeout = 5 * time.Second

// Open connects to url, creating the database first if it does not exist.
func Open(ctx context.Context, url string, opts Options) (*gorm.DB, error) {
	db, err := open(ctx, url, opts)
	if err == nil || SQLState(err) != "3D000" { // invalid_catalog_name: the database is missing
		return db, err
	}
	if cerr := createDatabase(ctx, url); cerr != nil {
		return nil, cerr
	}
	// pgx stops at the first host that lacks the database; with several
	// hosts that may be a replica that has not replayed CREATE DATABASE yet.
	for deadline := time.Now().Add(10 * time.Second); ; {
		db, err = open(ctx, url, opts)
		if err == nil || SQLState(err) != "3D000" || time.Now().After(deadline) {
			return db, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func open(ctx context.Context, url string, opts Options) (*gorm.DB, error) {
	cfg, err := connConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["statement_timeout"] = ms(opts.StatementTimeout)
	cfg.RuntimeParams["lock_timeout"] = ms(opts.LockTimeout)
	// A transaction left open by a bug must not hold locks forever.
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "60000"
	cfg.RuntimeParams["application_name"] = cmp.Or(opts.ApplicationName, "orderservice")
	// A client span per statement, after PostgreSQL's semantic conventions:
	// the statement with its placeholders, never the values bound to them.
	cfg.Tracer = otelpgx.NewTracer()

	// uuid.UUID arguments are encoded as the 16 bytes they are; without
	// this pgx asks their driver.Valuer for a string and parses it back,
	// for every id of every statement.
	sqlDB := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(func(_ context.Context, c *pgx.Conn) error {
		pgxuuid.Register(c.TypeMap())
		return nil
	}))
	sqlDB.SetMaxOpenConns(opts.MaxConns)
	sqlDB.SetMaxIdleConns(opts.MaxConns)
	lifetime := opts.ConnMaxLifetime
	if lifetime <= 0 {
		lifetime = DefaultConnMaxLifetime
	}
	sqlDB.SetConnMaxLifetime(lifetime)
	sqlDB.SetConnMaxIdleTime(min(lifetime, 5*time.Minute))

	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		// Every write here already runs in an explicit transaction.
		SkipDefaultTransaction: true,
		Logger:                 logger.Discard,
		// PostgreSQL keeps microseconds: so does every time we write and echo.
		NowFunc: func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
	})
	if err != nil {
		sqlDB.Close()
		return nil, err
	}
	return db, nil
}

func ms(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }

// createDatabase connects to the server's maintenance database and creates
// the database that url names. A concurrent creator is not an error. With a
// multi-host URL it connects as the pool would (target_session_attrs
// included), so it creates the database on the primary.
func createDatabase(ctx context.Context, rawURL string) error {
	cfg, err := connConfig(rawURL)
	if err != nil {
		return err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to create database %q: %w", name, err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if err != nil && SQLState(err) != "42P04" { // duplicate_database
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// connConfig parses url (single or multi-host, libpq rules) into the
// connection settings every connection of the service uses.
func connConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = defaultConnectTimeout
	}
	// A server that answers a write with "read-only transaction" is a
	// replica (a demoted primary, or a proxy that moved): close that
	// connection, so the pool connects again and finds the primary.
	// FATAL errors (57P01 admin shutdown among them) close it already.
	next := cfg.OnPgError
	cfg.OnPgError = func(c *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if pgErr.Code == readOnlyTransaction {
			return false
		}
		return next == nil || next(c, pgErr)
	}
	return cfg, nil
}

// CheckURL reports whether url is a PostgreSQL URL the pool can use: one or
// several hosts, libpq parameters such as target_session_attrs.
func CheckURL(url string) error {
	_, err := pgx.ParseConfig(url)
	return err
}

// Close closes the pool behind db.
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// Ping reports whether the database answers within ctx.
func Ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// ErrReadOnly means the server the pool reached accepts no writes: a
// replica, or a primary being demoted.
var ErrReadOnly = errors.New("the database server is read-only")

// CheckWritable reports whether the server behind db answers within ctx and
// accepts writes; a replica answers ErrReadOnly.
func CheckWritable(ctx context.Context, db *gorm.DB) error {
	var readOnly string
	if err := db.WithContext(ctx).Raw("SELECT current_setting('transaction_read_only')").Row().Scan(&readOnly); err != nil {
		return err
	}
	if readOnly != "off" {
		return ErrReadOnly
	}
	return nil
}

// SQLState returns the PostgreSQL error code in err's chain, or "".
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// readOnlyTransaction is SQLSTATE 25006: a write sent to a server that is
// (now) a replica.
const readOnlyTransaction = "25006"

// IsUnavailable reports whether err means the database could not be reached,
// dropped the connection or is not (or no longer) the primary: a transient
// failure worth a 503 and a retry.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	code := SQLState(err)
	switch {
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "57P"), // operator intervention: 57P01 admin shutdown (a switchover), crash recovery
		code == readOnlyTransaction,    // a replica (a demoted primary): the pool reconnects to the primary
		code == "53300",                // too many connections
		code == "57014":                // query canceled (statement_timeout)
		return true
	case code != "":
		return false
	}
	var connErr *pgconn.ConnectError
	// A connection that dropped mid-statement (even mid-COMMIT, where the
	// outcome is unknown) is transient too: the client retries with the same
	// key, and the record decides whether anything happened.
	return errors.As(err, &connErr) || errors.Is(err, pgconn.ErrReadOnlyConnection) || errors.Is(err, ErrReadOnly) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, context.DeadlineExceeded) ||
		isNetError(err)
}

// IsLockTimeout reports whether err is a lock_timeout: another transaction
// holds what we wait for (for a duplicate: the first request is in flight).
func IsLockTimeout(err error) bool { return SQLState(err) == "55P03" }
