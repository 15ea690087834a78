package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// useCase is an order use case as the routes call it: on the order named
// in the path (orderID), or on none ("").
type useCase[Req any] func(ctx context.Context, c order.Caller, orderID string, req Req) (idempotency.Result, error)

// idempotent adapts a use case that acts on no existing resource (create)
// to a handler.
func idempotent[Req any](s *Server, op string, run func(context.Context, order.Caller, Req) (idempotency.Result, error)) echo.HandlerFunc {
	return idempotentOn(s, op, func(ctx context.Context, c order.Caller, _ string, req Req) (idempotency.Result, error) {
		return run(ctx, c, req)
	})
}

// idempotentOn adapts a use case on the order named in the path. The
// handler only reads the key and the body: claiming, executing and storing
// the result happen in the use case's transaction; the handler renders the
// result it returns.
func idempotentOn[Req any](s *Server, op string, run useCase[Req]) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Set(ctxOperation, op)
		key, err := idempotency.ParseKeyHeader(c.Request().Header.Values("Idempotency-Key"))
		if err != nil {
			return err
		}
		c.Set(ctxKey, key)
		wait, err := preferredWait(c.Request().Header.Values("Prefer"))
		if err != nil {
			return err
		}
		var req Req
		if err := readBody(c, &req); err != nil {
			return err
		}
		door := order.Door{Yield: slotOf(c.Request().Context()), Wait: wait, Waited: func(d time.Duration) {
			c.Response().Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(d/time.Second)))
		}}
		caller := order.Caller{TenantID: tenant(c), Key: key, Door: door}
		res, err := run(c.Request().Context(), caller, c.Param("id"), req)
		if err != nil {
			return err
		}
		c.Set(ctxDisposition, idempotency.DispositionOf(res, nil))
		if res.Outcome == idempotency.OutcomeCreated {
			c.Set(ctxOrderID, res.Resource)
		}
		return send(c, answer.Render(res))
	}
}

func (s *Server) getOrder(c echo.Context) error {
	o, err := s.Orders.Get(c.Request().Context(), tenant(c), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

// maxCustomerID is the longest customer_id filter, in characters, as
// api/openapi.yaml bounds it (and the order's own customer_id).
const maxCustomerID = 100

func (s *Server) listOrders(c echo.Context) error {
	pg, err := pageRequest(c)
	if err != nil {
		return err
	}
	status, err := queryParam(c, "status")
	if err != nil {
		return err
	}
	customer, err := queryParam(c, "customer_id")
	if err != nil {
		return err
	}
	if utf8.RuneCountInString(customer) > maxCustomerID {
		return invalidQuery("customer_id", fmt.Sprintf("must be at most %d characters", maxCustomerID))
	}
	f := order.ListFilter{Status: order.Status(status), CustomerID: customer, Page: pg}
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
	pg := order.PageRequest{Cursor: c.QueryParam("cursor")} // empty: the first page
	l, err := queryParam(c, "limit")
	if err != nil || l == "" {
		return pg, err
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > 100 {
		return pg, invalidQuery("limit", "must be an integer between 1 and 100")
	}
	pg.Limit = n
	return pg, nil
}

// queryParam reads an optional query parameter. One given with an empty
// value is rejected rather than read as absent: api/openapi.yaml bounds it
// below by one character, an enum or an integer (only an empty cursor, the
// first page, is documented as allowed).
func queryParam(c echo.Context, name string) (string, error) {
	q := c.QueryParams()
	if !q.Has(name) {
		return "", nil
	}
	if v := q.Get(name); v != "" {
		return v, nil
	}
	return "", invalidQuery(name, "must not be empty")
}

func invalidQuery(name, why string) error {
	return problem.Errorf(problem.InvalidRequest, "%s: %s", name, why).With("field", name)
}
