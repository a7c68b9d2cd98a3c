package configstore_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"log/slog"

	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// count counts the records at level whose attributes include attrs.
func (r *logRecorder) count(level slog.Level, attrs ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level != level {
			continue
		}
		got := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool { got[a.Key] = a.Value.String(); return true })
		match := true
		for i := 0; i+1 < len(attrs); i += 2 {
			if got[attrs[i]] != attrs[i+1] {
				match = false
			}
		}
		if match {
			n++
		}
	}
	return n
}

const ledgerName = "omicron-sled-config.json"

// realLedger opens a ledger over two fresh directories and returns it with
// its directories and copy paths.
func realLedger(t *testing.T) (*ledger.Ledger, []string, []string) {
	t.Helper()
	base := t.TempDir()
	dirs := []string{filepath.Join(base, "a"), filepath.Join(base, "b")}
	l, err := ledger.Open(dirs, ledgerName, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l, dirs, []string{filepath.Join(dirs[0], ledgerName), filepath.Join(dirs[1], ledgerName)}
}

// run runs s until the returned stop is called.
func run(s *configstore.Store) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

func wantCopies(t *testing.T, s *configstore.Store, gen uint64, want ...ledger.CopyState) []ledger.CopyStatus {
	t.Helper()
	got := s.CopyStatus()
	var states []ledger.CopyState
	for _, c := range got {
		states = append(states, c.State)
		if c.State == ledger.StateOK && c.Generation != gen {
			t.Errorf("copy %s: generation %d, want %d", c.Path, c.Generation, gen)
		}
	}
	if !slices.Equal(states, want) {
		t.Fatalf("copies %v, want %v: %+v", states, want, got)
	}
	return got
}

// breakDir replaces dir with a regular file, which stops writes even for
// root (chmod does not).
func breakDir(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
}

const period = time.Minute

// A copy deleted or corrupted behind the agent's back is found and rewritten
// within a period, by a store that loaded the config at start as by one
// that was given it.
func TestCheckRewritesADeletedOrCorruptCopy(t *testing.T) {
	for _, reopen := range []bool{false, true} {
		for _, damage := range []struct {
			name  string
			state ledger.CopyState
			do    func(path string) error
		}{
			{"deleted", ledger.StateMissing, os.Remove},
			{"corrupted", ledger.StateCorrupt, func(path string) error {
				return os.WriteFile(path, []byte(`{"format":1,"generation":5}`+"\n"), 0o600)
			}},
		} {
			t.Run(damage.name+map[bool]string{true: " after a restart"}[reopen], func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					l, dirs, paths := realLedger(t)
					logs := &logRecorder{}
					s := configstore.Open(l, slog.New(logs), nil, configstore.Options{CheckPeriod: period})
					if err := s.Put(t.Context(), doc(5, 2)); err != nil {
						t.Fatal(err)
					}
					if reopen {
						l2, err := ledger.Open(dirs, ledgerName, nil)
						if err != nil {
							t.Fatal(err)
						}
						s = configstore.Open(l2, slog.New(logs), nil, configstore.Options{CheckPeriod: period})
					}
					stop := run(s)
					defer stop()
					if err := damage.do(paths[1]); err != nil {
						t.Fatal(err)
					}
					time.Sleep(period + time.Second)
					synctest.Wait()

					wantCopies(t, s, 5, ledger.StateOK, ledger.StateOK)
					if _, now, err := l.Repair(ledger.Record{Generation: 5, Data: s.Current().Canonical()}); err != nil || now[1].State != ledger.StateOK {
						t.Fatalf("the copy was not rewritten: %v %+v", err, now)
					}
					if n := logs.count(slog.LevelWarn, "path", paths[1], "was", string(damage.state)); n != 1 {
						t.Errorf("%d warnings that %s was %s, want 1", n, paths[1], damage.state)
					}
				})
			})
		}
	}
}

// A copy that cannot be rewritten is reported, logged once as an error, and
// rewritten once it can be.
func TestCheckReportsACopyItCannotRewrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, dirs, paths := realLedger(t)
		logs := &logRecorder{}
		s := configstore.Open(l, slog.New(logs), nil, configstore.Options{CheckPeriod: period})
		if err := s.Put(t.Context(), doc(5, 2)); err != nil {
			t.Fatal(err)
		}
		stop := run(s)
		defer stop()
		breakDir(t, dirs[1])
		for range 3 {
			time.Sleep(period)
			synctest.Wait()
		}
		got := wantCopies(t, s, 5, ledger.StateOK, ledger.StateWriteFailed)
		if !strings.Contains(got[1].Err, "was unreadable") || !strings.Contains(got[1].Err, "create temp file") {
			t.Errorf("copy error %q does not say what was wrong and why the rewrite failed", got[1].Err)
		}
		if n := logs.count(slog.LevelError, "path", paths[1], "state", string(ledger.StateWriteFailed)); n != 1 {
			t.Errorf("%d errors logged for %s over three rounds, want 1", n, paths[1])
		}

		if err := os.Remove(dirs[1]); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dirs[1], 0o700); err != nil {
			t.Fatal(err)
		}
		time.Sleep(period)
		synctest.Wait()
		wantCopies(t, s, 5, ledger.StateOK, ledger.StateOK)
		if _, err := os.Stat(paths[1]); err != nil {
			t.Fatalf("copy not rewritten: %v", err)
		}
	})
}

// A PUT with one ledger directory unwritable succeeds, and the copy is
// reported degraded, loudly.
func TestPutWithOneCopyUnwritable(t *testing.T) {
	l, dirs, paths := realLedger(t)
	logs := &logRecorder{}
	s := configstore.Open(l, slog.New(logs), nil, configstore.Options{})
	breakDir(t, dirs[1])
	if err := s.Put(t.Context(), doc(5, 2)); err != nil {
		t.Fatalf("Put with one copy writable: %v", err)
	}
	if s.Current() == nil || s.Current().Generation != 5 {
		t.Fatalf("current %v", s.Current())
	}
	if got := wantCopies(t, s, 5, ledger.StateOK, ledger.StateWriteFailed); got[1].Err == "" {
		t.Errorf("degraded copy without a reason: %+v", got[1])
	}
	if n := logs.count(slog.LevelError, "path", paths[1], "state", string(ledger.StateWriteFailed)); n != 1 {
		t.Errorf("%d errors logged for the degraded copy, want 1", n)
	}
}

// A check never waits for the commit slot: with a commit stuck it leaves
// the round out.
func TestCheckDoesNotWaitForAStuckCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &fakeLedger{rec: ledger.Record{Generation: 7, Data: doc(7, 2)},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}
		s := configstore.Open(l, nil, nil, configstore.Options{CheckPeriod: period})
		stop := run(s)
		defer stop()
		time.Sleep(period + time.Second)
		synctest.Wait()
		if l.repairCount() != 1 {
			t.Fatalf("%d repairs after one period, want 1", l.repairCount())
		}

		l.entered, l.block = make(chan struct{}), make(chan struct{})
		put := make(chan error)
		go func() { put <- s.Put(context.Background(), doc(8, 2)) }()
		<-l.entered // the Put holds the commit slot
		time.Sleep(3 * period)
		synctest.Wait() // Run is idle, not stuck on the slot
		if l.repairCount() != 1 {
			t.Fatalf("%d repairs while a commit held the slot, want 1", l.repairCount())
		}
		close(l.block)
		if err := <-put; err != nil {
			t.Fatal(err)
		}
		time.Sleep(period)
		synctest.Wait()
		if l.repairCount() != 2 {
			t.Fatalf("%d repairs after the commit, want 2", l.repairCount())
		}
	})
}
