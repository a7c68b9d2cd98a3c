package agent

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A change of the local storage allocations waits for the one before it
// only as long as its request lasts, and takes its turn once that ends.
func TestLocalStorageChangesWaitWithTheirRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &Agent{localOp: make(chan struct{}, 1)}
		if err := a.lockLocalStorage(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := a.lockLocalStorage(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("behind a change that does not end: %v, want the request's deadline", err)
		}
		<-a.localOp
		if err := a.lockLocalStorage(t.Context()); err != nil {
			t.Fatalf("after the change before it ended: %v", err)
		}
	})
}
