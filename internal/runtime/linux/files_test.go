package linux

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

func TestProcWalkerSharesWalks(t *testing.T) {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Skip("no /proc/self/ns/net:", err)
	}
	var w procWalker
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]map[string][]int, 50)
	for i := range results {
		wg.Go(func() {
			m, err := w.walk(ctx)
			if err != nil {
				t.Error(err)
			}
			results[i] = m
		})
	}
	wg.Wait()
	distinct := map[*int]bool{}
	for _, m := range results {
		if m == nil {
			t.Fatal("a caller got no walk")
		}
		for _, pids := range m {
			if len(pids) > 0 {
				distinct[&pids[0]] = true
				break
			}
		}
	}
	// Some processes share our namespace (the test's parent, at least),
	// and the walk never lists ourselves.
	for _, m := range results {
		for _, pid := range m[self] {
			if pid == os.Getpid() {
				t.Fatalf("the walk lists this process itself")
			}
		}
	}
	if len(distinct) >= len(results) {
		t.Errorf("%d callers at once caused %d walks; want them shared", len(results), len(distinct))
	}
	// A caller whose context has ended returns rather than wait.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	w.walk(cctx)
}
