// Package channel is the mock payment channel: an in-memory acquirer that
// honours idempotency keys and injects the faults a real network has (lost
// responses, 503s, latency), so that the order service can prove it never
// charges twice.
package channel

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// DefaultSlowDelay is how long pm_slow waits when Options.SlowDelay is zero.
const DefaultSlowDelay = 2 * time.Second

// Options configure a Server; the zero value is usable.
type Options struct {
	// SlowDelay is how long pm_slow charges and refunds take (default 2s).
	SlowDelay time.Duration
	// Logger receives request and fault logs; nil discards them.
	Logger *slog.Logger
	// Rand drives the fault dice; set it for deterministic fault tests.
	Rand rand.Source
}

// Server is the mock channel. Its state lives in memory and is safe for
// concurrent use.
type Server struct {
	echo      *echo.Echo
	store     *store
	faults    *faultInjector
	slowDelay time.Duration
	log       *slog.Logger
}

// New returns a channel with no charges and no faults.
func New(opts Options) *Server {
	s := &Server{
		echo:      echo.New(),
		store:     newStore(),
		faults:    newFaultInjector(opts.Rand),
		slowDelay: opts.SlowDelay,
		log:       opts.Logger,
	}
	if s.slowDelay <= 0 {
		s.slowDelay = DefaultSlowDelay
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.echo.HideBanner, s.echo.HidePort = true, true
	s.echo.HTTPErrorHandler = s.handleError
	s.echo.Use(s.logRequests)
	s.routes()
	return s
}

// routes is the one place every endpoint of the channel is declared.
func (s *Server) routes() {
	s.echo.GET("/healthz", s.healthz)

	v1 := s.echo.Group("/v1")
	v1.POST("/charges", serveIdempotent(s, s.chargeOp()))
	v1.GET("/charges", serveLookup(s, s.store.charge, errChargeNotFound))
	v1.POST("/refunds", serveIdempotent(s, s.refundOp()))
	v1.GET("/refunds", serveLookup(s, s.store.refund, errRefundNotFound))

	admin := s.echo.Group("/admin")
	admin.GET("/stats", s.adminStats)
	admin.GET("/charges", s.adminCharges)
	admin.GET("/faults", s.adminGetFaults)
	admin.POST("/faults", s.adminSetFaults)
	admin.POST("/reset", s.adminReset)
}

// Handler returns the HTTP handler serving the channel's API.
func (s *Server) Handler() http.Handler { return s.echo }

// Stats returns the counters so far.
func (s *Server) Stats() Stats { return s.store.snapshot() }

// Charges lists the charges made, oldest first, with the POSTs per key.
func (s *Server) Charges() []ChargeRecord { return s.store.chargeRecords() }

// Reset forgets every charge, refund, counter and fault.
func (s *Server) Reset() {
	s.store.update(s.store.reset)
	_ = s.faults.set(Faults{}) // zero faults are always valid
}

// Faults returns the faults in force.
func (s *Server) Faults() Faults { return s.faults.get() }

// SetFaults replaces the faults in force; out-of-range settings are refused.
func (s *Server) SetFaults(f Faults) error { return s.faults.set(f) }

// beforeRequest applies the latency and 503 faults to a /v1 request.
func (s *Server) beforeRequest(ctx context.Context) error {
	err := s.faults.beforeRequest(ctx)
	if errors.Is(err, errUnavailable) {
		s.store.countUnavailable()
	}
	return err
}

func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil {
			status = problemFor(err).Status
		}
		s.log.Debug("request",
			"method", c.Request().Method,
			"path", c.Request().URL.Path,
			"idempotency_key", c.Request().Header.Get("Idempotency-Key"),
			"status", status,
			"duration", time.Since(start))
		return err
	}
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) adminStats(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Stats())
}

func (s *Server) adminCharges(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string][]ChargeRecord{"charges": s.Charges()})
}

func (s *Server) adminGetFaults(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Faults())
}

func (s *Server) adminSetFaults(c echo.Context) error {
	var f Faults
	if err := decodeBody(c, &f); err != nil {
		return err
	}
	if err := s.SetFaults(f); err != nil {
		return err
	}
	s.log.Info("faults set", "lost_response_rate", f.LostResponseRate, "unavailable_rate", f.UnavailableRate,
		"latency_ms", f.LatencyMS, "latency_jitter_ms", f.LatencyJitterMS)
	return c.JSON(http.StatusOK, s.Faults())
}

func (s *Server) adminReset(c echo.Context) error {
	s.Reset()
	return c.NoContent(http.StatusNoContent)
}
