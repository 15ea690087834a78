//go:build faults

package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
	for pkg, out := range map[string]*string{
		"github.com/orderservice/orderservice/cmd/orderservice":   &bins.orderservice,
		"github.com/orderservice/orderservice/cmd/paymentchannel": &bins.paymentchannel,
	} {
		*out = filepath.Join(dir, filepath.Base(pkg))
		if b, err := exec.Command("go", "build", "-o", *out, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: go build %s: %v\n%s", pkg, err, b)
			return 1
		}
	}
	return m.Run()
}
