package database

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/stdlib"
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
	if err := knownVersion(m, set); err != nil {
		return 0, err
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return 0, fmt.Errorf("apply migrations: %w", err)
	}
	v, _, err := m.Version()
	return v, err
}

// knownVersion refuses a database whose recorded version names no
// migration of set: it was migrated by a build with another history (the
// migrations were made one baseline before the first release), and
// golang-migrate would otherwise fail with "file does not exist".
func knownVersion(m *migrate.Migrate, set MigrationSet) error {
	v, _, err := m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return nil // a new database
	}
	if err != nil {
		return err
	}
	names, err := fs.Glob(set.FS, path.Join(set.Dir, fmt.Sprintf("%03d_*.up.sql", v)))
	if err != nil || len(names) == 0 {
		return fmt.Errorf("the database is at migration %d, which this build does not have: it was migrated by an earlier development build; recreate it (with compose: docker compose down -v)", v)
	}
	return nil
}

// newMigrator connects the way the pool does (pgx's parser: several hosts
// and target_session_attrs=read-write find the primary) rather than through
// golang-migrate's own URL handling.
func newMigrator(dbURL string, set MigrationSet) (*migrate.Migrate, error) {
	src, err := iofs.New(set.FS, set.Dir)
	if err != nil {
		return nil, err
	}
	cfg, err := connConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "orderservice-migrate"
	sqlDB := stdlib.OpenDB(*cfg)
	// The database name is part of golang-migrate's advisory lock id: "/name"
	// is what its URL driver used, so instances of older and newer builds
	// starting together still take the same lock.
	driver, err := pgxmigrate.WithInstance(sqlDB, &pgxmigrate.Config{DatabaseName: "/" + cfg.Database, MigrationsTable: set.Table})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("open migrator: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		driver.Close()
		return nil, fmt.Errorf("open migrator: %w", err)
	}
	return m, nil
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
