// Package migrations embeds the SQL migrations so the binary applies its own
// schema at start. Files are numbered NNN_name.up.sql / NNN_name.down.sql.
package migrations

import "embed"

// FS holds every migration file, read by golang-migrate's iofs source.
//
//go:embed *.sql
var FS embed.FS
