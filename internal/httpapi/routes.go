package httpapi

import (
	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/order"
)

// routes lists every route of the service in one place.
func (s *Server) routes(e *echo.Echo) {
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(s.Metrics.Handler()))
	// The channel's webhooks: no tenant key, the signature authenticates.
	e.POST("/webhooks/payment-channel", s.paymentWebhook)

	v1 := e.Group("/v1", s.authenticate, wellFormed)
	v1.POST("/orders", idempotent(s, order.OpCreate, s.Orders.Create))
	v1.GET("/orders", s.listOrders)
	v1.GET("/orders/:id", s.getOrder)
	v1.GET("/orders/:id/events", s.orderEvents)
	v1.POST(onOrder(order.OpPay), idempotentOn(s, order.OpPay, s.Orders.Pay))             // /orders/:id/pay
	v1.POST(onOrder(order.OpCancel), idempotentOn(s, order.OpCancel, s.Orders.Cancel))    // /orders/:id/cancel
	v1.POST(onOrder(order.OpShip), idempotentOn(s, order.OpShip, s.Orders.Ship))          // /orders/:id/ship
	v1.POST(onOrder(order.OpDeliver), idempotentOn(s, order.OpDeliver, s.Orders.Deliver)) // /orders/:id/deliver
	v1.GET("/idempotency-records", s.idempotencyRecords)
	v1.GET("/idempotency-policy", s.idempotencyPolicy)
}

// onOrder is the path of an operation on an order: the order's, then the
// operation's verb.
func onOrder(operation string) string { return "/orders/:id/" + order.Verb(operation) }
