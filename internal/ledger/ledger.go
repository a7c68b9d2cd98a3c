// Package ledger stores one generation-numbered document durably in several directories.
//
// Every directory holds one copy of the document in a small checksummed
// envelope (see format.go). A copy is replaced atomically: the new contents
// are written to a temp file in the same directory, fsynced, renamed over the
// copy, and the directory is fsynced. A crash at any point leaves either the
// old or the new copy, never a mix; the temp file left behind is ignored by
// Read and removed by Open.
//
// Read returns the valid copy with the highest generation. The ledger knows
// nothing about what the document means: it neither compares generations on
// Commit nor repairs copies on Read. A caller that wants every copy current
// after a Read that reported a problem commits the record it read.
package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Sentinel errors. Errors returned by this package wrap them with %w and say
// which copy had which problem.
var (
	// ErrNotFound: no copy exists in any directory (a fresh ledger).
	ErrNotFound = errors.New("ledger not found")
	// ErrCorrupt: no copy is valid and at least one exists but failed
	// validation.
	ErrCorrupt = errors.New("ledger corrupt")
	// ErrUnreadable: no copy is valid and at least one could not be read
	// (permission or I/O error, directory gone). The document may well be
	// intact, so this must not be treated like ErrNotFound. Read wraps both
	// ErrCorrupt and ErrUnreadable when both apply.
	ErrUnreadable = errors.New("ledger unreadable")
	// ErrNoCopyWritten: Commit could not write a single copy.
	ErrNoCopyWritten = errors.New("no ledger copy written")
	// ErrInvalidData: Commit was given data it will not store (not a single
	// JSON value without surrounding whitespace, or too large). Nothing was
	// written.
	ErrInvalidData = errors.New("invalid ledger data")
)

// Record is one version of the document.
type Record struct {
	Generation uint64
	// Data is the document: a single JSON value with no leading or
	// trailing whitespace. Read returns exactly the bytes Commit was given.
	Data []byte
}

// CopyState is what is known about one copy of the ledger.
type CopyState string

const (
	// StateOK: the copy is valid and holds the best generation.
	StateOK CopyState = "ok"
	// StateMissing: the directory exists but holds no copy.
	StateMissing CopyState = "missing"
	// StateCorrupt: the copy exists but failed validation (Err says why).
	StateCorrupt CopyState = "corrupt"
	// StateUnreadable: the copy could not be read: permission or I/O error,
	// directory missing or not a directory, not a regular file.
	StateUnreadable CopyState = "unreadable"
	// StateStale: the copy is valid but older than the best copy (or, rarely,
	// holds the same generation with different data; Err says which).
	StateStale CopyState = "stale"
	// StateWriteFailed: the last Commit could not write this copy.
	StateWriteFailed CopyState = "write_failed"
)

// CopyStatus describes one copy.
type CopyStatus struct {
	Path  string
	State CopyState
	// Generation is the copy's generation when it is valid (ok or stale),
	// else 0.
	Generation uint64
	// Err says what is wrong; empty when State is ok or missing.
	Err string
}

// Ledger is one document kept in several directories.
//
// Read, Commit and Status may be called from any goroutine. Commit calls are
// serialized by commitMu; Read takes no lock and may run alongside a Commit
// (it then sees each copy either before or after its replacement).
type Ledger struct {
	name  string
	dirs  []string // cleaned, in the order given to Open
	paths []string // paths[i] is the copy in dirs[i]
	log   *slog.Logger

	// commitMu serializes Commit so concurrent commits cannot leave copies
	// holding different documents. It is held only across Commit's own disk
	// writes; Read and Status never take it.
	commitMu sync.Mutex

	// seq orders status snapshots: Read takes a number when it starts, Commit
	// when its writes are done, and a snapshot is published only if no
	// snapshot with a higher number has been. So Status never goes back to a
	// view older than the newest completed operation.
	seq    atomic.Uint64
	status atomic.Pointer[snapshot]
}

type snapshot struct {
	seq    uint64
	copies []CopyStatus
}

// Open prepares a ledger named name (a file name such as
// "omicron-sled-config.json") kept in every directory of dirs. It creates
// missing directories with mode 0o700 and removes temp files left by
// interrupted writes of this ledger.
//
// Open fails only on bad arguments: no directories, an empty or duplicate
// directory (two paths naming the same directory), or a name that is not a
// plain file name. A directory that cannot be created or cleaned is logged at
// warn and left in the ledger: its copy then shows as unreadable or
// write_failed, and the other copies carry on.
func Open(dirs []string, name string, log *slog.Logger) (*Ledger, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("ledger %s: no directories", name)
	}
	l := &Ledger{
		name: name,
		log:  log.With("component", "ledger", "ledger", name),
	}
	for _, d := range dirs {
		if d == "" {
			return nil, fmt.Errorf("ledger %s: empty directory name", name)
		}
		d = filepath.Clean(d)
		if slices.Contains(l.dirs, d) {
			return nil, fmt.Errorf("ledger %s: directory %s given twice", name, d)
		}
		l.dirs = append(l.dirs, d)
		l.paths = append(l.paths, filepath.Join(d, name))
	}

	type seenDir struct {
		dir string
		fi  fs.FileInfo
	}
	var seen []seenDir
	for _, d := range l.dirs {
		if err := ensureDir(d); err != nil {
			l.log.Warn("ledger directory unusable", "dir", d, "err", err)
			continue
		}
		fi, err := os.Stat(d)
		if err != nil {
			l.log.Warn("ledger directory unusable", "dir", d, "err", err)
			continue
		}
		for _, s := range seen {
			if os.SameFile(s.fi, fi) {
				return nil, fmt.Errorf("ledger %s: directories %s and %s are the same directory", name, s.dir, d)
			}
		}
		seen = append(seen, seenDir{d, fi})
		l.removeTempFiles(d)
	}
	return l, nil
}

// checkName accepts only a plain file name that cannot be mistaken for one
// of our temp files.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return fmt.Errorf("ledger: invalid name %q", name)
	case strings.ContainsAny(name, "/\x00") || name != filepath.Base(name):
		return fmt.Errorf("ledger: name %q is not a plain file name", name)
	case strings.HasPrefix(name, tempPrefix):
		return fmt.Errorf("ledger: name %q starts with the temp file prefix %q", name, tempPrefix)
	}
	return nil
}

// removeTempFiles removes this ledger's leftover temp files from dir.
func (l *Ledger) removeTempFiles(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		l.log.Warn("cannot list ledger directory for leftover temp files", "dir", dir, "err", err)
		return
	}
	for _, e := range entries {
		if !isTempName(e.Name(), l.name) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil {
			l.log.Warn("cannot remove leftover ledger temp file", "path", p, "err", err)
			continue
		}
		l.log.Info("removed leftover ledger temp file from an interrupted write", "path", p)
	}
}

// Read returns the valid copy with the highest generation and the status of
// every copy, in the order of the directories given to Open.
//
// When no copy is valid it returns an error naming each path and its problem,
// wrapping ErrNotFound if no copy exists at all, otherwise ErrCorrupt and/or
// ErrUnreadable. The statuses are returned in every case.
//
// If two valid copies hold the same, highest generation with different data
// (which correct callers never cause), the copy in the earliest directory
// wins and the other is reported stale.
func (l *Ledger) Read() (Record, []CopyStatus, error) {
	seq := l.seq.Add(1)
	statuses := make([]CopyStatus, len(l.dirs))
	recs := make([]Record, len(l.dirs))
	best := -1
	for i := range l.dirs {
		recs[i], statuses[i] = readCopy(l.dirs[i], l.paths[i])
		if statuses[i].State == StateOK && (best < 0 || recs[i].Generation > recs[best].Generation) {
			best = i
		}
	}
	if best >= 0 {
		b := recs[best]
		for i := range statuses {
			if i == best || statuses[i].State != StateOK {
				continue
			}
			switch {
			case recs[i].Generation < b.Generation:
				statuses[i].State = StateStale
				statuses[i].Err = fmt.Sprintf("generation %d is older than generation %d in %s",
					recs[i].Generation, b.Generation, l.paths[best])
			case !bytes.Equal(recs[i].Data, b.Data):
				statuses[i].State = StateStale
				statuses[i].Err = fmt.Sprintf("same generation %d as %s but different data",
					b.Generation, l.paths[best])
			}
		}
	}
	l.publish(seq, statuses)

	if best >= 0 {
		for _, st := range statuses {
			if st.State != StateOK {
				l.log.Warn("ledger copy not current", "path", st.Path, "state", st.State,
					"generation", st.Generation, "err", st.Err, "best_generation", recs[best].Generation)
			}
		}
		return recs[best], statuses, nil
	}
	return Record{}, statuses, l.noValidCopyError(statuses)
}

// noValidCopyError builds Read's error when no copy is valid.
func (l *Ledger) noValidCopyError(statuses []CopyStatus) error {
	var corrupt, unreadable bool
	problems := make([]string, 0, len(statuses))
	for _, st := range statuses {
		switch st.State {
		case StateCorrupt:
			corrupt = true
		case StateUnreadable:
			unreadable = true
		}
		if st.Err == "" {
			problems = append(problems, fmt.Sprintf("%s: %s", st.Path, st.State))
		} else {
			problems = append(problems, fmt.Sprintf("%s: %s: %s", st.Path, st.State, st.Err))
		}
	}
	detail := strings.Join(problems, "; ")
	switch {
	case corrupt && unreadable:
		return fmt.Errorf("ledger %s: no valid copy (%w, %w): %s", l.name, ErrCorrupt, ErrUnreadable, detail)
	case corrupt:
		return fmt.Errorf("ledger %s: no valid copy (%w): %s", l.name, ErrCorrupt, detail)
	case unreadable:
		return fmt.Errorf("ledger %s: no valid copy (%w): %s", l.name, ErrUnreadable, detail)
	default:
		return fmt.Errorf("ledger %s: %w: %s", l.name, ErrNotFound, detail)
	}
}

// Commit writes rec to every directory, replacing each copy atomically (see
// the package doc). It returns the status of every copy, in the order of the
// directories given to Open.
//
// It returns an error wrapping ErrNoCopyWritten only when no copy could be
// written; failures of some copies are reported in the statuses (as
// write_failed) and logged at warn. It returns ErrInvalidData, having written
// nothing, when rec.Data is not a single JSON value without surrounding
// whitespace or is larger than 16 MiB.
//
// Commit does not compare generations: enforcing generation rules is the
// caller's job. Concurrent Commits are serialized.
func (l *Ledger) Commit(rec Record) ([]CopyStatus, error) {
	if err := checkData(rec.Data); err != nil {
		return nil, fmt.Errorf("ledger %s: generation %d: %w", l.name, rec.Generation, err)
	}
	contents := encodeCopy(rec)

	l.commitMu.Lock()
	defer l.commitMu.Unlock()

	statuses := make([]CopyStatus, len(l.dirs))
	written := 0
	for i, dir := range l.dirs {
		st := CopyStatus{Path: l.paths[i]}
		if err := writeCopy(dir, l.name, contents); err != nil {
			st.State = StateWriteFailed
			st.Err = err.Error()
		} else {
			st.State = StateOK
			st.Generation = rec.Generation
			written++
		}
		statuses[i] = st
	}
	l.publish(l.seq.Add(1), statuses)

	if written == 0 {
		problems := make([]string, len(statuses))
		for i, st := range statuses {
			problems[i] = fmt.Sprintf("%s: %s", st.Path, st.Err)
		}
		return statuses, fmt.Errorf("ledger %s: generation %d: %w: %s",
			l.name, rec.Generation, ErrNoCopyWritten, strings.Join(problems, "; "))
	}
	for _, st := range statuses {
		if st.State != StateOK {
			l.log.Warn("ledger copy not written", "path", st.Path, "generation", rec.Generation,
				"err", st.Err, "copies_written", written)
		}
	}
	return statuses, nil
}

// Status returns the copy statuses as of the newest completed Read or
// Commit, or nil before the first one. It does no I/O, takes no lock and
// returns a slice the caller owns.
func (l *Ledger) Status() []CopyStatus {
	s := l.status.Load()
	if s == nil {
		return nil
	}
	return slices.Clone(s.copies)
}

// publish makes copies the snapshot returned by Status unless a snapshot
// with a higher sequence number is already published.
func (l *Ledger) publish(seq uint64, copies []CopyStatus) {
	next := &snapshot{seq: seq, copies: slices.Clone(copies)}
	for {
		cur := l.status.Load()
		if cur != nil && cur.seq > seq {
			return
		}
		if l.status.CompareAndSwap(cur, next) {
			return
		}
	}
}
