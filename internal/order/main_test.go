package order_test

import (
	"os"
	"testing"

	"github.com/orderservice/orderservice/tests/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "order"))
}
