package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The tenant every benchmark request is sent as.
const (
	benchTenant = "bench"
	benchAPIKey = "bench-key-0123456789"
)

// createBody is the body of a create request, as the API documents it.
type createBody struct {
	CustomerID string     `json:"customer_id"`
	Currency   string     `json:"currency"`
	Items      []itemBody `json:"items"`
}

type itemBody struct {
	SKU       string `json:"sku"`
	Quantity  int    `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
}

// newCreate is the n-th distinct purchase: its own customer and items, so
// no two requests of a run share a key or a body.
func newCreate(n uint64) createBody {
	return createBody{
		CustomerID: fmt.Sprintf("cust-%d", n%5000),
		Currency:   "EUR",
		Items: []itemBody{
			{SKU: fmt.Sprintf("SKU-%04d", n%9973), Quantity: int(1 + n%3), UnitPrice: int64(1000 + n%500)},
			{SKU: fmt.Sprintf("SKU-%04d", (n+17)%9973), Quantity: 1, UnitPrice: 250},
		},
	}
}

func header(key string) http.Header {
	return http.Header{
		"Authorization":   {"Bearer " + benchAPIKey},
		"Content-Type":    {"application/json"},
		"Idempotency-Key": {key},
	}
}

// keys hands out Idempotency-Keys that are unique for the whole run.
type keys struct{ n atomic.Uint64 }

func (k *keys) next() (string, uint64) {
	n := k.n.Add(1)
	return fmt.Sprintf("bench-%08d", n), n
}

// freshCreates gives every request its own Idempotency-Key and body: each
// is a new intent, so each creates an order.
func freshCreates(url string, k *keys) vegeta.Targeter {
	return func(t *vegeta.Target) error {
		key, n := k.next()
		body, err := json.Marshal(newCreate(n))
		if err != nil {
			return err
		}
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, url, body, header(key)
		return nil
	}
}

// sameRequest sends one request, byte for byte, every time: a client
// retrying one intent, as the replay and storm scenarios need.
func sameRequest(url, key string, body []byte) vegeta.Targeter {
	return func(t *vegeta.Target) error {
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, url, body, header(key)
		return nil
	}
}

var errOutOfOrders = errors.New("no prepared order is left to pay")

// pays pays each prepared order once, with its own key and method.
func pays(baseURL string, orderIDs []string, method string, k *keys) vegeta.Targeter {
	var next atomic.Int64
	body := []byte(`{"payment_method":"` + method + `"}`)
	return func(t *vegeta.Target) error {
		i := next.Add(1) - 1
		if i >= int64(len(orderIDs)) {
			return errOutOfOrders
		}
		key, _ := k.next()
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, baseURL+"/v1/orders/"+orderIDs[i]+"/pay", body, header(key)
		return nil
	}
}

// inTurn sends each of targets once, in order.
func inTurn(targets []vegeta.Target) vegeta.Targeter {
	var next atomic.Int64
	return func(t *vegeta.Target) error {
		i := next.Add(1) - 1
		if i >= int64(len(targets)) {
			return vegeta.ErrNoTargets
		}
		*t = targets[i]
		return nil
	}
}
