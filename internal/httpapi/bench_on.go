//go:build bench

package httpapi

import (
	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/order"
)

// benchRoutes adds, in benchmark builds only, a create route with the
// idempotency layer switched off, so `make bench` can measure its cost.
func (s *Server) benchRoutes(g *echo.Group) {
	g.POST("/bench/orders-without-idempotency", idempotent(s, order.OpCreate, s.Orders.CreateWithoutIdempotency))
}
