package app

import (
	"context"

	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
)

// slotFreeChannel is the payment channel as the HTTP door's admission
// limit sees it: a request calling the channel waits on something other
// than the service, holding no database connection, so it gives its
// admission slot back (httpapi.Yield) to a request with work to do. Its
// place at the channel (order.MoneyConfig.MaxChannelCalls) still bounds
// how many such calls run at once.
type slotFreeChannel struct{ order.Channel }

func (c slotFreeChannel) Charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
	httpapi.Yield(ctx)
	return c.Channel.Charge(ctx, key, req)
}

func (c slotFreeChannel) LookupCharge(ctx context.Context, key string) (payment.Charge, error) {
	httpapi.Yield(ctx)
	return c.Channel.LookupCharge(ctx, key)
}

func (c slotFreeChannel) Refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
	httpapi.Yield(ctx)
	return c.Channel.Refund(ctx, key, req)
}

func (c slotFreeChannel) LookupRefund(ctx context.Context, key string) (payment.Refund, error) {
	httpapi.Yield(ctx)
	return c.Channel.LookupRefund(ctx, key)
}
