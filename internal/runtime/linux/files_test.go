package linux

import (
	"context"
	"os"
	"path/filepath"
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

// A zone's mark is written where its root is, making the root; written
// again, it is replaced whole and leaves no temp file behind.
func TestWriteMark(t *testing.T) {
	root := filepath.Join(t.TempDir(), "oxz_crucible_x")
	for _, mark := range []string{`{"name":"first"}`, `{"name":"second, longer than the first"}`} {
		if err := writeMark(root, []byte(mark)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, ownerFile))
		if err != nil || string(got) != mark {
			t.Fatalf("mark = %q, %v; want %q", got, err, mark)
		}
		ents, err := os.ReadDir(root)
		if err != nil || len(ents) != 1 {
			t.Fatalf("root holds %v (%v); want the mark alone", ents, err)
		}
	}
}
