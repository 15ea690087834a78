package idempotency_test

import (
	"context"
	"os"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/tests/testdb"
)

var (
	db    *gorm.DB
	dbURL string
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int {
		dbURL = url
		var err error
		db, err = database.Open(context.Background(), url, database.Options{MaxConns: 10, StatementTimeout: time.Minute, LockTimeout: 3 * time.Second})
		if err != nil {
			panic(err)
		}
		defer database.Close(db)
		return m.Run()
	}, "idempotency"))
}

func newStore() *idempotency.Store {
	return &idempotency.Store{Lease: 5 * time.Second, Policy: idempotency.Policy{
		Windows:         []idempotency.Window{{Name: "client_retry", Duration: 24 * time.Hour}},
		Margin:          time.Hour,
		MoneyOperations: []string{"op.money"},
	}}
}

func tx(t *testing.T, fn func(tx *gorm.DB) error) {
	t.Helper()
	if err := database.Transact(context.Background(), db, fn); err != nil {
		t.Fatal(err)
	}
}
