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
// commits the record again, or hands it to Repair, which rewrites only the
// copies that do not hold it.
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
	"syscall"
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
	// Checked says the committer knows Data to be a single JSON value (it
	// made Data by encoding, or by parsing it as one, as a config's
	// canonical form is made): Commit and Repair then check its size and
	// whitespace but do not read the JSON again. Read leaves it false.
	Checked bool
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
	// StateWriteFailed: the last Commit or Repair could not write this copy
	// (Err says why); it holds whatever it held before.
	StateWriteFailed CopyState = "write_failed"
	// StateNotDurable: the last Commit or Repair put the new copy in place,
	// so it is what Read returns, but a later step failed (typically the
	// fsync of the directory, Err says which): a machine crash may bring
	// back the copy it replaced. Only Commit and Repair report it; Repair
	// fsyncs the directory again.
	StateNotDurable CopyState = "not_durable"
)

// CopyStatus describes one copy.
type CopyStatus struct {
	Path  string
	State CopyState
	// Generation is the copy's generation when it is valid (ok, stale or
	// not_durable), else 0.
	Generation uint64
	// Err says what is wrong; empty when State is ok or missing.
	Err string
}

// Ledger is one document kept in several directories.
//
// Read, Commit, Repair and Status may be called from any goroutine. Commit
// and Repair calls are serialized by commitMu; Read takes no lock and may run alongside a Commit
// (it then sees each copy either before or after its replacement).
type Ledger struct {
	name  string
	dirs  []string // cleaned, in the order given to Open
	paths []string // paths[i] is the copy in dirs[i]
	log   *slog.Logger

	// commitMu serializes Commit and Repair so concurrent writes cannot
	// leave copies holding different documents. It is held only across
	// their own disk reads and writes; Read and Status never take it.
	commitMu sync.Mutex
	// notDurable[i] is set while copy i is known to be in place but not
	// durable (see StateNotDurable). Guarded by commitMu; Commit's writer
	// of copy i alone touches notDurable[i].
	notDurable []bool

	// fault, set only by tests, makes single steps of a write fail; it is
	// called from the writers of several copies at once.
	fault faultFunc

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
	l.notDurable = make([]bool, len(l.dirs))

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

// Commit writes rec to every directory, all at once, replacing each copy
// atomically (see the package doc). It returns the status of every copy, in the order of the
// directories given to Open.
//
// A copy counts as written once its new contents are in place, which is what
// Read (now, or after a restart) would return: ok, or not_durable when a step
// after the rename failed. A copy that could not be written is write_failed.
// Commit returns an error wrapping ErrNoCopyWritten only when no copy was
// written, so an error always means that Read still returns what it did
// before; failures of some copies are reported in the statuses and logged at
// warn. It returns ErrInvalidData, having written nothing, when rec.Data is
// not a single JSON value without surrounding whitespace or is larger than
// 16 MiB.
//
// Commit does not compare generations: enforcing generation rules is the
// caller's job. Concurrent Commits are serialized.
func (l *Ledger) Commit(rec Record) ([]CopyStatus, error) {
	if err := checkData(rec); err != nil {
		return nil, fmt.Errorf("ledger %s: generation %d: %w", l.name, rec.Generation, err)
	}
	contents := encodeCopy(rec)

	l.commitMu.Lock()
	defer l.commitMu.Unlock()

	// The copies are written at once: a commit waits for the slowest
	// copy's fsyncs rather than for every copy's in turn. Each copy is
	// replaced atomically on its own, so a crash leaves each either old or
	// new, as when they are written one after another.
	statuses := make([]CopyStatus, len(l.dirs))
	var wg sync.WaitGroup
	for i := range l.dirs {
		wg.Go(func() { statuses[i] = l.writeLocked(i, rec, contents) })
	}
	wg.Wait()
	l.publish(l.seq.Add(1), statuses)

	written := countWritten(statuses)
	if written == 0 {
		return statuses, l.noCopyWrittenError(rec, statuses)
	}
	for _, st := range statuses {
		if st.State != StateOK {
			l.log.Warn("ledger copy not written durably", "path", st.Path, "state", st.State,
				"generation", rec.Generation, "err", st.Err, "copies_written", written)
		}
	}
	return statuses, nil
}

// Repair makes every copy hold rec, touching only the copies that need it:
// a copy that does not hold exactly rec (missing, corrupt, unreadable,
// another generation or other data) is rewritten, and the directory of a
// copy left not_durable by an earlier Commit or Repair is fsynced again.
// Copies that hold rec durably are only read.
//
// It returns the copies as Repair found them (ok when they held rec, else
// what was wrong) and as it left them (ok, not_durable or write_failed, with
// Err saying what was wrong and why the rewrite failed), both in the order
// of the directories given to Open, and publishes the second for Status. Its
// error wraps ErrNoCopyWritten when no copy holds rec afterwards, or
// ErrInvalidData as Commit's does.
//
// Repair, like Commit, does not compare generations. It is serialized with
// Commit.
func (l *Ledger) Repair(rec Record) (found, now []CopyStatus, err error) {
	if err := checkData(rec); err != nil {
		return nil, nil, fmt.Errorf("ledger %s: generation %d: %w", l.name, rec.Generation, err)
	}
	var contents []byte // encoded on first need

	l.commitMu.Lock()
	defer l.commitMu.Unlock()

	found = make([]CopyStatus, len(l.dirs))
	now = make([]CopyStatus, len(l.dirs))
	for i := range l.dirs {
		got, st := readCopy(l.dirs[i], l.paths[i])
		holds := st.State == StateOK && got.Generation == rec.Generation && bytes.Equal(got.Data, rec.Data)
		switch {
		case holds && !l.notDurable[i]:
			found[i], now[i] = st, st
			continue
		case holds:
			found[i] = CopyStatus{Path: l.paths[i], State: StateNotDurable, Generation: rec.Generation,
				Err: "the directory was not fsynced after the copy was written"}
			if err := l.fault.after(opSyncDir, l.dirs[i], syncDir(l.dirs[i])); err != nil {
				now[i] = found[i]
				now[i].Err = fmt.Sprintf("fsync directory again: %v", err)
				continue
			}
			l.notDurable[i] = false
			now[i] = st
			continue
		case st.State == StateOK:
			st.State = StateStale
			st.Err = fmt.Sprintf("holds generation %d, not generation %d", got.Generation, rec.Generation)
			if got.Generation == rec.Generation {
				st.Err = fmt.Sprintf("holds generation %d with different data", got.Generation)
			}
		}
		found[i] = st
		if contents == nil {
			contents = encodeCopy(rec)
		}
		now[i] = l.writeLocked(i, rec, contents)
		if now[i].State != StateOK {
			what := string(st.State)
			if st.Err != "" {
				what += ": " + st.Err
			}
			now[i].Err = fmt.Sprintf("was %s; rewriting it: %s", what, now[i].Err)
		}
	}
	l.publish(l.seq.Add(1), now)
	if countWritten(now) == 0 {
		return found, now, l.noCopyWrittenError(rec, now)
	}
	return found, now, nil
}

// writeLocked writes copy i and says how it went; commitMu must be held.
func (l *Ledger) writeLocked(i int, rec Record, contents []byte) CopyStatus {
	st := CopyStatus{Path: l.paths[i]}
	renamed, err := writeCopy(l.dirs[i], l.name, contents, l.fault)
	switch {
	case err == nil:
		st.State, st.Generation = StateOK, rec.Generation
	case !renamed:
		// Failed before the rename: the old copy is untouched.
		st.State, st.Err = StateWriteFailed, err.Error()
	default:
		// The rename was attempted, so the new contents may be in place
		// even though a step failed. They count as written unless reading
		// the copy back shows that it holds something else: what Read
		// would return after a restart must agree with what Commit said.
		switch holds, why := copyHolds(l.paths[i], rec); holds {
		case holdsRec:
			st.State, st.Generation, st.Err = StateNotDurable, rec.Generation, err.Error()
		case holdsUnknown:
			st.State, st.Generation = StateNotDurable, rec.Generation
			st.Err = fmt.Sprintf("%v; could not read the copy back (%s), so it counts as written", err, why)
		default:
			st.State, st.Err = StateWriteFailed, fmt.Sprintf("%v; the copy %s", err, why)
		}
	}
	l.notDurable[i] = st.State == StateNotDurable
	return st
}

// holding is copyHolds's answer.
type holding int

const (
	holdsNot holding = iota
	holdsRec
	holdsUnknown
)

// copyHolds says whether the copy at path holds exactly rec, and if not,
// why not. It answers unknown when the copy cannot be read for a reason that
// does not show its contents (an I/O or permission error).
func copyHolds(path string, rec Record) (holding, string) {
	b, err := readFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return holdsNot, "does not exist"
	case errors.Is(err, errNotRegular):
		return holdsNot, "is not a regular file"
	case err != nil:
		return holdsUnknown, err.Error()
	}
	got, err := decodeCopy(b)
	switch {
	case err != nil:
		return holdsNot, "is corrupt: " + err.Error()
	case got.Generation != rec.Generation:
		return holdsNot, fmt.Sprintf("holds generation %d", got.Generation)
	case !bytes.Equal(got.Data, rec.Data):
		return holdsNot, "holds other data"
	}
	return holdsRec, ""
}

// countWritten counts the copies holding the record just written.
func countWritten(statuses []CopyStatus) int {
	n := 0
	for _, st := range statuses {
		if st.State == StateOK || st.State == StateNotDurable {
			n++
		}
	}
	return n
}

func (l *Ledger) noCopyWrittenError(rec Record, statuses []CopyStatus) error {
	problems := make([]string, len(statuses))
	for i, st := range statuses {
		problems[i] = fmt.Sprintf("%s: %s", st.Path, st.Err)
	}
	return fmt.Errorf("ledger %s: generation %d: %w: %s",
		l.name, rec.Generation, ErrNoCopyWritten, strings.Join(problems, "; "))
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

// Remove deletes every copy, for a document that is to exist no more (a
// record whose subject is gone), and fsyncs each directory so that the
// removal outlives a crash. A copy that is already missing counts as
// removed. It returns the copies as it left them (missing, or unreadable
// with Err saying why the removal failed) and an error naming every copy
// it could not remove: those still hold what they held, and Read may
// still return it. It is serialized with Commit and Repair.
func (l *Ledger) Remove() ([]CopyStatus, error) {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	statuses := make([]CopyStatus, len(l.dirs))
	var problems []string
	for i := range l.dirs {
		st := CopyStatus{Path: l.paths[i], State: StateMissing}
		err := os.Remove(l.paths[i])
		switch {
		case errors.Is(err, fs.ErrNotExist):
			err = checkDir(l.dirs[i]) // a missing directory may be an absent disk
		case err == nil:
			err = syncDir(l.dirs[i])
		}
		if err != nil {
			st.State, st.Err = StateUnreadable, fmt.Sprintf("removing it: %v", err)
			problems = append(problems, fmt.Sprintf("%s: %v", l.paths[i], err))
		} else {
			l.notDurable[i] = false
		}
		statuses[i] = st
	}
	l.publish(l.seq.Add(1), statuses)
	if len(problems) > 0 {
		return statuses, fmt.Errorf("ledger %s: not every copy removed: %s", l.name, strings.Join(problems, "; "))
	}
	return statuses, nil
}
