package order

import (
	"context"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// Waiter lets a duplicate wait for its intent's first outcome
// (idempotency.Waiter).
type Waiter interface {
	// Await returns true once the intent of scope moved on, false when ctx
	// ended first.
	Await(ctx context.Context, db *gorm.DB, scope idempotency.Scope) bool
}

// cancelOn calls cancel once done is closed, and returns the function that
// stops watching. A nil done is never closed.
func cancelOn(done <-chan struct{}, cancel func()) (stop func()) {
	if done == nil {
		return func() {}
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-done:
			cancel()
		case <-stopped:
		}
	}()
	return func() { close(stopped) }
}
