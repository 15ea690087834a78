//go:build bench

package order

import (
	"context"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
)

// CreateWithoutIdempotency is Create with the idempotency layer switched
// off: the same validation, the same rows, the same response, but no record
// is claimed or stored. It exists only in benchmark builds (-tags bench), to
// measure what the layer costs; a retry of it makes a second order.
func (s *Service) CreateWithoutIdempotency(ctx context.Context, c Caller, req CreateRequest) (idempotency.Result, error) {
	n, total, err := req.normalize()
	if err != nil {
		return idempotency.Result{}, err
	}
	var resp idempotency.Result
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		o, err := newOrder(c.TenantID, n, total)
		if err != nil {
			return err
		}
		if err := insertOrder(tx, o, OpCreate, c.Key); err != nil {
			return err
		}
		resp, err = created(o)
		return err
	})
	return resp, err
}
