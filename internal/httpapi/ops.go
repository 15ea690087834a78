package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/idempotency"
)

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is ready when the service can serve /v1 (see Ready: the database
// answers, accepts writes and has the schema this binary was built for).
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	version, err := s.Ready(ctx)
	if err != nil {
		return err
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
	recs, err := s.Orders.IdempotencyRecords(c.Request().Context(), tenant(c), c.QueryParam("key"))
	if err != nil {
		return err
	}
	out := make([]recordJSON, len(recs))
	for i, r := range recs {
		status, err := responseStatus(r)
		if err != nil {
			return err
		}
		out[i] = recordJSON{Operation: r.Operation, IdempotencyKey: r.IdempotencyKey, State: r.State,
			Fingerprint: r.Fingerprint, ResourceID: r.Resource(), ResponseStatus: status,
			Attempts: r.Attempts, LeaseToken: r.LeaseToken, LeaseExpiresAt: r.LeaseExpiresAt,
			CreatedAt: r.CreatedAt, CompletedAt: r.CompletedAt, ExpiresAt: r.Expiry()}
	}
	return c.JSON(http.StatusOK, map[string]any{"records": out})
}

// responseStatus is the HTTP status a record's stored result renders to (and
// every replay of it is sent with), or nil while it holds none.
func responseStatus(r idempotency.Record) (*int, error) {
	if r.Outcome == nil {
		return nil, nil
	}
	res, err := r.Result()
	if err != nil {
		return nil, err
	}
	status := answer.Render(res).Status
	return &status, nil
}

// idempotencyPolicy shows the retention policy in force and how it follows
// from the replay windows.
func (s *Server) idempotencyPolicy(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Orders.IdempotencyPolicy())
}
