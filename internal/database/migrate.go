package database

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/migrations"
)

// Migrate applies every pending migration in migrations.FS. golang-migrate
// takes an advisory lock, so several instances may start at once.
func Migrate(url string) (version uint, err error) {
	return MigrateSet(url, MigrationSet{FS: migrations.FS, Dir: "."})
}

// MigrationSet is one numbered set of migrations and the table that
// records how far a database has come through it.
type MigrationSet struct {
	FS  fs.FS
	Dir string // the directory in FS that holds the files
	// Table records the applied version; empty is golang-migrate's
	// schema_migrations. A second set naming its own table can share a
	// database with the first without either seeing the other's version.
	Table string
}

// MigrateSet applies every pending migration of set to the database at url.
func MigrateSet(url string, set MigrationSet) (version uint, err error) {
	m, err := newMigrator(url, set)
	if err != nil {
		return 0, err
	}
	defer func() {
		if srcErr, dbErr := m.Close(); err == nil {
			err = errors.Join(srcErr, dbErr)
		}
	}()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return 0, fmt.Errorf("apply migrations: %w", err)
	}
	v, _, err := m.Version()
	return v, err
}

func newMigrator(dbURL string, set MigrationSet) (*migrate.Migrate, error) {
	src, err := iofs.New(set.FS, set.Dir)
	if err != nil {
		return nil, err
	}
	target := pgxURL(dbURL)
	if set.Table != "" {
		sep := "?"
		if strings.Contains(target, "?") {
			sep = "&"
		}
		target += sep + "x-migrations-table=" + url.QueryEscape(set.Table)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, target)
	if err != nil {
		return nil, fmt.Errorf("open migrator: %w", err)
	}
	return m, nil
}

// pgxURL rewrites a postgres:// URL to the scheme of golang-migrate's pgx/v5 driver.
func pgxURL(url string) string {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if rest, ok := strings.CutPrefix(url, scheme); ok {
			return "pgx5://" + rest
		}
	}
	return url
}

// LatestVersion is the highest migration version embedded in the binary.
func LatestVersion() (uint, error) {
	names, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil || len(names) == 0 {
		return 0, fmt.Errorf("no embedded migrations: %v", err)
	}
	var latest uint
	for _, n := range names {
		var v uint
		if _, err := fmt.Sscanf(n, "%d_", &v); err == nil && v > latest {
			latest = v
		}
	}
	return latest, nil
}

// SchemaVersion reads the applied migration version; dirty means a migration
// failed half-way and needs a human.
func SchemaVersion(ctx context.Context, db *gorm.DB) (version uint, dirty bool, err error) {
	row := db.WithContext(ctx).Raw("SELECT version, dirty FROM schema_migrations LIMIT 1").Row()
	err = row.Scan(&version, &dirty)
	return version, dirty, err
}
