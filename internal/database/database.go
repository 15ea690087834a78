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
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
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
}

// Open connects to url, creating the database first if it does not exist.
func Open(ctx context.Context, url string, opts Options) (*gorm.DB, error) {
	db, err := open(ctx, url, opts)
	if err != nil && SQLState(err) == "3D000" { // invalid_catalog_name: the database is missing
		if cerr := createDatabase(ctx, url); cerr != nil {
			return nil, cerr
		}
		db, err = open(ctx, url, opts)
	}
	return db, err
}

func open(ctx context.Context, url string, opts Options) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	cfg.RuntimeParams["statement_timeout"] = ms(opts.StatementTimeout)
	cfg.RuntimeParams["lock_timeout"] = ms(opts.LockTimeout)
	// A transaction left open by a bug must not hold locks forever.
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "60000"
	cfg.RuntimeParams["application_name"] = cmp.Or(opts.ApplicationName, "orderservice")

	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(opts.MaxConns)
	sqlDB.SetMaxIdleConns(opts.MaxConns)
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)

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
// the database that url names. A concurrent creator is not an error.
func createDatabase(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	conn, err := pgx.Connect(ctx, u.String())
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

// SQLState returns the PostgreSQL error code in err's chain, or "".
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsUnavailable reports whether err means the database could not be reached
// or dropped the connection: a transient failure worth a 503 and a retry.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	code := SQLState(err)
	switch {
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "57P"), // operator intervention: shutdown, crash recovery
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
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, context.DeadlineExceeded) ||
		isNetError(err)
}

// IsLockTimeout reports whether err is a lock_timeout: another transaction
// holds what we wait for (for a duplicate: the first request is in flight).
func IsLockTimeout(err error) bool { return SQLState(err) == "55P03" }
