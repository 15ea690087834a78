package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/orderservice/orderservice/client"
)

// Generate the key once per intent, before the first attempt, and reuse it
// on every retry: the service then answers a retry after a lost response
// with the order it already created, instead of creating a second one.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client.New("http://localhost:8080", "demo-key-acme")

	// The intent "buy two SKU-1 for cus_42" gets its key now, once. Keep it
	// with the intent (a database row, a job payload) if the intent may
	// outlive this process.
	key := client.NewKey()
	req := client.CreateOrderRequest{
		CustomerID: "cus_42",
		Currency:   "EUR",
		Items:      []client.ItemRequest{{SKU: "SKU-1", Quantity: 2, UnitPrice: 1250}},
	}

	// Lost answers, timeouts and 503s are retried inside the call, all
	// under key.
	created, err := c.CreateOrder(ctx, req, client.WithKey(key))
	for attempt := 1; err != nil && attempt < 3; attempt++ {
		var pe *client.ProblemError
		if errors.As(err, &pe) && pe.Status < 500 && !client.IsInProgress(err) {
			log.Fatalf("final answer, do not retry: %v", err)
		}
		// Still unknown: resume the SAME intent later, with the SAME key.
		// A new key here is exactly how a second order gets created.
		time.Sleep(time.Second)
		created, err = c.CreateOrder(ctx, req, client.WithKey(key))
	}
	if err != nil {
		log.Fatalf("create, outcome unknown; resume later with key %s: %v", key, err)
	}
	fmt.Printf("order %s (replayed: %v, attempts: %d)\n", created.Value.ID, created.Replayed, created.Attempts)

	// Paying is a new intent on the same order: it gets its own key, made by
	// the call itself this time and reported in the result.
	paid, err := c.Pay(ctx, created.Value.ID, client.PayRequest{PaymentMethod: "pm_ok"})
	switch {
	case client.IsDeclined(err):
		fmt.Println("declined: pay again with a new key and another method")
	case client.IsInvalidTransition(err):
		fmt.Println("the order is no longer payable")
	case err != nil:
		fmt.Printf("outcome unknown: resume with client.WithKey(%q): %v\n", paid.Key, err)
	default:
		fmt.Println("paid", paid.Value.Payment.ChargeID)
	}
}
