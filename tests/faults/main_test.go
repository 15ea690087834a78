//go:build faults

package faults

import (
	"fmt"
	"os"
	"testing"

	"github.com/orderservice/orderservice/tests/testproc"
)

// bins are the binaries under test, built once for the package.
var bins struct {
	orderservice   string
	paymentchannel string
}

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "faults-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	const orderservice, paymentchannel = "github.com/orderservice/orderservice/cmd/orderservice", "github.com/orderservice/orderservice/cmd/paymentchannel"
	built, err := testproc.Build(dir, orderservice, paymentchannel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	bins.orderservice, bins.paymentchannel = built[orderservice], built[paymentchannel]
	return m.Run()
}
