package order

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/problem"
)

// An intent whose payment's verdict came in by another way first (a
// webhook, the sweeper's lookup) answers with that verdict: a failed
// refund as a refund that failed, as the channel's own answer would read
// (refundReply), never as a charge's decline.
func TestAVerdictThatCameAnotherWayIsNamedForItsKind(t *testing.T) {
	for _, tc := range []struct {
		kind PaymentKind
		code problem.Code
		says string
	}{
		{KindRefund, CodeRefundRefused, "refused the refund (refund_failed)"},
		{KindCharge, CodePaymentDeclined, "declined the charge"},
	} {
		p := Payment{ID: uuid.New(), Kind: tc.kind, Status: PaymentFailed}
		o := &Order{ID: uuid.New(), payments: []Payment{p}}
		res, err := intentResult(o, p, channelReply{verdict: pending}, false)
		if err != nil || res.Failure == nil {
			t.Fatalf("a failed %s stored another way: %+v, %v; want its failure", tc.kind, res, err)
		}
		if res.Failure.Code != tc.code || !strings.Contains(res.Failure.Detail, tc.says) {
			t.Errorf("a failed %s stored another way answers %s %q, want %s saying %q",
				tc.kind, res.Failure.Code, res.Failure.Detail, tc.code, tc.says)
		}
	}
}
