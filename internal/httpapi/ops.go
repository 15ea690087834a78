package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is ready when the database answers and its schema is the one this
// binary was built for.
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	unavailable := func(detail string) error {
		return &problem.Error{Code: problem.ServiceUnavailable, Detail: detail, RetryAfter: time.Second}
	}
	if err := database.Ping(ctx, s.DB); err != nil {
		return unavailable("The database is unreachable.")
	}
	latest, err := database.LatestVersion()
	if err != nil {
		return err
	}
	version, dirty, err := database.SchemaVersion(ctx, s.DB)
	if err != nil || dirty || version < latest {
		return unavailable("Database migrations are pending.")
	}
	return c.JSON(http.StatusOK, map[string]any{"status": "ready", "schema_version": version})
}

// recordJSON is the wire form of an idempotency record.
type recordJSON struct {
	Operation      string            `json:"operation"`
	IdempotencyKey string            `json:"idempotency_key"`
	State          idempotency.State `json:"state"`
	Fingerprint    string            `json:"fingerprint"`
	ResourceID     string            `json:"resource_id"`
	ResponseStatus *int              `json:"response_status"`
	Attempts       int               `json:"attempts"`
	LeaseToken     int64             `json:"lease_token"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at"`
	CreatedAt      time.Time         `json:"created_at"`
	CompletedAt    *time.Time        `json:"completed_at"`
	ExpiresAt      *time.Time        `json:"expires_at"`
}

// idempotencyRecords shows the tenant's records for one key: the teaching
// view of "what did the service remember about this intent?".
func (s *Server) idempotencyRecords(c echo.Context) error {
	key, err := idempotency.ParseKey(c.QueryParam("key"))
	if err != nil {
		return problem.Errorf(problem.InvalidRequest, "key: must be an idempotency key").With("field", "key")
	}
	recs, err := s.Records.Find(s.DB.WithContext(c.Request().Context()), tenant(c), key)
	if err != nil {
		return err
	}
	out := make([]recordJSON, len(recs))
	for i, r := range recs {
		out[i] = recordJSON{Operation: r.Operation, IdempotencyKey: r.IdempotencyKey, State: r.State,
			Fingerprint: r.Fingerprint, ResourceID: r.Resource(), ResponseStatus: r.ResponseStatus,
			Attempts: r.Attempts, LeaseToken: r.LeaseToken, LeaseExpiresAt: r.LeaseExpiresAt,
			CreatedAt: r.CreatedAt, CompletedAt: r.CompletedAt, ExpiresAt: r.Expiry()}
	}
	return c.JSON(http.StatusOK, map[string]any{"records": out})
}

// idempotencyPolicy shows the retention policy in force and how it follows
// from the replay windows.
func (s *Server) idempotencyPolicy(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Policy.Describe(s.Records.Lease))
}
