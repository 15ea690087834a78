package app_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/tests/apptest"
)

// A second transport calls the same use case and Render: what it gets is
// what HTTP sends for the same intent, whichever door came first.
func TestAUseCaseRenderedOutsideHTTPIsTheHTTPAnswer(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	acme := apptest.NewClient(m, apptest.KeyAcme)
	ctx := context.Background()
	create := order.CreateRequest{CustomerID: "render-1", Currency: "EUR",
		Items: []order.ItemRequest{{SKU: "sku-1", Quantity: 2, UnitPrice: 1250}}}
	same := func(t *testing.T, what string, rendered answer.Response, r apptest.Response) {
		t.Helper()
		if rendered.Status != r.Status || !bytes.Equal(rendered.Body, r.Body) ||
			rendered.Location != r.Header.Get("Location") || rendered.ContentType != r.Header.Get("Content-Type") {
			t.Errorf("%s: rendered %d %q %q %s\nHTTP         %d %q %q %s", what, rendered.Status, rendered.Location, rendered.ContentType, rendered.Body,
				r.Status, r.Header.Get("Location"), r.Header.Get("Content-Type"), r.Body)
		}
	}

	t.Run("a create run outside HTTP renders as HTTP replays it", func(t *testing.T) {
		key := "render-" + uuid.NewString()
		res, err := m.Orders.Create(ctx, order.Caller{TenantID: "acme", Key: key}, create)
		if err != nil {
			t.Fatal(err)
		}
		first := answer.Render(res)
		again := acme.Do(t, http.MethodPost, "/v1/orders", key, create)
		if first.Status != http.StatusCreated || first.Replayed {
			t.Errorf("first = %d replayed %v, want 201 executed", first.Status, first.Replayed)
		}
		same(t, "create", first, again)
		apptest.WantAnswer(t, "the HTTP retry", again, http.StatusCreated, "")
		if again.Header.Get("Idempotent-Replayed") != "true" {
			t.Error("the HTTP retry was not a replay")
		}
	})

	t.Run("a refusal over HTTP renders the same from the use case's replay", func(t *testing.T) {
		id := acme.Do(t, http.MethodPost, "/v1/orders", "render-"+uuid.NewString(), create).JSON(t)["id"].(string)
		key := "render-ship-" + uuid.NewString()
		ship := order.ShipRequest{Carrier: "DHL", TrackingNumber: "T-1"}
		first := acme.Do(t, http.MethodPost, "/v1/orders/"+id+"/ship", key, ship)
		apptest.WantProblem(t, first, http.StatusConflict, "invalid_transition")
		res, err := m.Orders.Ship(ctx, order.Caller{TenantID: "acme", Key: key}, id, ship)
		if err != nil {
			t.Fatal(err)
		}
		replay := answer.Render(res)
		if !replay.Replayed {
			t.Error("the use case's second run was not a replay")
		}
		same(t, "refused ship", replay, first)
	})
}
