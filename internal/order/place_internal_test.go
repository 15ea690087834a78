package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/orderservice/orderservice/internal/problem"
)

func TestAPlaceAtTheChannelIsTakenOnceAndWaitedForByTheSweeper(t *testing.T) {
	calls := semaphore.NewWeighted(1)
	first := &channelPlace{calls: calls}
	if err := first.take(); err != nil {
		t.Fatalf("the first take: %v", err)
	}
	if err := first.take(); err != nil { // a phase-1 transaction tried again
		t.Fatalf("taking a place already held: %v", err)
	}

	second := &channelPlace{calls: calls}
	if err := second.take(); problem.CodeOf(err) != problem.ServiceUnavailable {
		t.Fatalf("a take with no place free = %v, want service_unavailable", err)
	}
	expired, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := second.wait(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait that ends first = %v, want its context's error", err)
	}

	waited := make(chan error, 1)
	go func() { waited <- second.wait(context.Background()) }()
	first.release()
	first.release() // the deferred release after an earlier one: nothing more
	if err := <-waited; err != nil {
		t.Fatalf("the sweeper's wait: %v", err)
	}
	second.release()
	if !calls.TryAcquire(1) || calls.TryAcquire(1) {
		t.Error("after both released, exactly one place should be free")
	}
}
