package app_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
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

// A body is JSON for a program, not markup: `<`, `>` and `&` a client
// sent come back as they are in every answer (the create, its replay, the
// reads) and in the event the outbox publishes, never as `\u003c`.
func TestBodiesCarryWhatTheClientSentUnescaped(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	acme := apptest.NewClient(m, apptest.KeyAcme)
	const customer, note = "Smith & Sons <wholesale>", "<b>fragile</b> & heavy"
	create := order.CreateRequest{CustomerID: customer, Currency: "EUR", Metadata: map[string]string{"note": note},
		Items: []order.ItemRequest{{SKU: "sku-1", Quantity: 1, UnitPrice: 1250}}}
	key := "plain-" + uuid.NewString()
	first := acme.Do(t, http.MethodPost, "/v1/orders", key, create)
	apptest.WantAnswer(t, "the create", first, http.StatusCreated, "")
	id := first.JSON(t)["id"].(string)
	bodies := map[string][]byte{"the create": first.Body}
	bodies["its replay"] = acme.Do(t, http.MethodPost, "/v1/orders", key, create).Body
	bodies["GET the order"] = acme.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil).Body
	bodies["the list"] = acme.Do(t, http.MethodGet, "/v1/orders?customer_id="+url.QueryEscape(customer), "", nil).Body
	var payload []byte
	if err := m.DB.Raw(`SELECT payload FROM order_outbox WHERE order_id = ?`, id).Row().Scan(&payload); err != nil {
		t.Fatal(err)
	}
	bodies["the outbox event"] = payload
	for what, body := range bodies {
		if !bytes.Contains(body, []byte(customer)) || !bytes.Contains(body, []byte(note)) || bytes.Contains(body, []byte(`\u00`)) {
			t.Errorf("%s: %s\nwant %q and %q as sent", what, body, customer, note)
		}
	}
}
