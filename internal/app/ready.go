package app

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/problem"
)

// ready is the readiness check the HTTP door answers GET /readyz with: the
// database answers, accepts writes (a replica, or no primary at all, is not
// ready: a failover is under way) and its schema is the one this binary was
// built for, and the broker door is open (broker is Door.Ready: connected,
// commands consumed, events relayed). It returns that schema's version, or
// a 503 problem saying what is awaited.
func ready(db *gorm.DB, broker func() error) func(ctx context.Context) (uint, error) {
	return func(ctx context.Context) (uint, error) {
		unavailable := func(detail string) error {
			return &problem.Error{Code: problem.ServiceUnavailable, Detail: detail, RetryAfter: time.Second}
		}
		switch err := database.CheckWritable(ctx, db); {
		case errors.Is(err, database.ErrReadOnly):
			return 0, unavailable("The database is read-only (a replica): waiting for a primary.")
		case err != nil:
			return 0, unavailable("No read-write database is reachable.")
		}
		latest, err := database.LatestVersion()
		if err != nil {
			return 0, err
		}
		version, dirty, err := database.SchemaVersion(ctx, db)
		if err != nil || dirty || version < latest {
			return 0, unavailable("Database migrations are pending.")
		}
		if broker() != nil { // why is in the log: the door says it when it goes down
			return 0, unavailable("The message broker (NATS) is unreachable: commands are not answered and events not published until the connection is back, which the service restores by itself.")
		}
		return version, nil
	}
}
