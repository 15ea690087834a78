// Package migrations embeds the SQL migrations so the binary applies its own
// schema at start. Files are numbered NNN_name.up.sql / NNN_name.down.sql.
package migrations

import "embed"

// FS holds every migration file of the order service's database, read by
// golang-migrate's iofs source.
//
//go:embed *.sql
var FS embed.FS

// ChannelFS holds, under channel/, the migrations of the mock payment
// channel's own database: a set apart from the service's, with its own
// version.
//
//go:embed channel/*.sql
var ChannelFS embed.FS
