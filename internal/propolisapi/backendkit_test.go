package propolisapi

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestWaitFor(t *testing.T) {
	var mu sync.Mutex
	st, changed := Status{Gen: 1, State: StateCreating}, make(chan struct{})
	current := func() (Status, <-chan struct{}) {
		mu.Lock()
		defer mu.Unlock()
		return st, changed
	}
	if got := WaitFor(context.Background(), 0, current); got.Gen != 1 {
		t.Fatalf("behind: %+v", got)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		st = Status{Gen: 2, State: StateStarting}
		close(changed)
		changed = make(chan struct{})
		mu.Unlock()
	}()
	if got := WaitFor(context.Background(), 1, current); got.Gen != 2 || got.State != StateStarting {
		t.Fatalf("after a change: %+v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if got := WaitFor(ctx, 2, current); got.Gen != 2 {
		t.Fatalf("when ctx ends: %+v", got)
	}
}

func TestSameSpec(t *testing.T) {
	if !SameSpec([]byte(`{"a": [1, 2]}`), []byte(`{"a":[1,2]}`)) {
		t.Error("spacing made two specs differ")
	}
	if SameSpec([]byte(`{"a":[1,2]}`), []byte(`{"a":[2,1]}`)) {
		t.Error("two specs taken for the same")
	}
}
