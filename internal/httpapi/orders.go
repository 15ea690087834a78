package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// idempotent adapts a use case that acts on no existing resource (create)
// to a handler. The handler only reads the key and the body: claiming,
// executing and storing the outcome happen in the use case's transaction.
func idempotent[Req any](s *Server, op string, run func(context.Context, order.Caller, Req) (idempotency.Response, error)) echo.HandlerFunc {
	return idempotentOn(s, op, func(ctx context.Context, c order.Caller, _ string, req Req) (idempotency.Response, error) {
		return run(ctx, c, req)
	})
}

// idempotentOn adapts a use case on the order named in the path.
func idempotentOn[Req any](s *Server, op string, run func(context.Context, order.Caller, string, Req) (idempotency.Response, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Set(ctxOperation, op)
		key, err := idempotency.ParseKeyHeader(c.Request().Header.Values("Idempotency-Key"))
		if err != nil {
			return err
		}
		c.Set(ctxKey, key)
		var req Req
		if err := decode(c, &req); err != nil {
			return err
		}
		caller := order.Caller{TenantID: tenant(c), Key: key}
		scope := idempotency.Scope{TenantID: caller.TenantID, Operation: op, Key: key}
		resp, err := s.awaitFirst(c, scope, func() (idempotency.Response, error) {
			return run(c.Request().Context(), caller, c.Param("id"), req)
		})
		if err != nil {
			return err
		}
		if resp.Location != "" {
			c.Set(ctxOrderID, resp.Location[len("/v1/orders/"):])
		}
		return send(c, resp)
	}
}

func (s *Server) getOrder(c echo.Context) error {
	o, err := s.Orders.Get(c.Request().Context(), tenant(c), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

func (s *Server) listOrders(c echo.Context) error {
	q := c.QueryParams()
	pg, err := pageRequest(c)
	if err != nil {
		return err
	}
	f := order.ListFilter{Status: order.Status(q.Get("status")), CustomerID: q.Get("customer_id"), Page: pg}
	page, err := s.Orders.List(c.Request().Context(), tenant(c), f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (s *Server) orderEvents(c echo.Context) error {
	pg, err := pageRequest(c)
	if err != nil {
		return err
	}
	page, err := s.Orders.History(c.Request().Context(), tenant(c), c.Param("id"), pg)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

// pageRequest reads the limit and cursor of a paginated list.
func pageRequest(c echo.Context) (order.PageRequest, error) {
	q := c.QueryParams()
	pg := order.PageRequest{Cursor: q.Get("cursor")}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return pg, problem.Errorf(problem.InvalidRequest, "limit: must be an integer between 1 and 100").With("field", "limit")
		}
		pg.Limit = n
	}
	return pg, nil
}
