package timesync

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
)

// Why time is not synchronized, for errors.Is on a *NotSyncedError. A
// Locate function returns ErrNoNTPZone or ErrNTPZoneNotRunning (or an error
// wrapping one).
var (
	ErrNoNTPZone         = errors.New("no NTP zone in the config")
	ErrNTPZoneNotRunning = errors.New("NTP zone not running")
	// ErrUnreachable: no report came back from the NTP zone's /timesync
	// (no answer, an error answer, or one that is not a TimeSync).
	ErrUnreachable = errors.New("/timesync unreachable")
	// ErrNotSynced: the NTP zone answered, and its time is not
	// synchronized.
	ErrNotSynced = errors.New("not synchronized")
	// ErrNotChecked: nothing has been asked yet.
	ErrNotChecked = errors.New("not checked yet")
)

// NotSyncedError is Check's answer while zones that need synchronized time
// must wait. Err is one of the Err* reasons above, or what Locate returned.
type NotSyncedError struct {
	Reason string
	Err    error
}

func (e *NotSyncedError) Error() string { return "time not yet synchronized: " + e.Reason }
func (e *NotSyncedError) Unwrap() error { return e.Err }

// Options set a Watcher up. Zero values take the defaults.
type Options struct {
	// Locate says where the sled's NTP zone's ntp-admin listens: its
	// underlay address with AdminPort. It must not block (the agent reads
	// it from its latest snapshots), and says ErrNoNTPZone when the
	// config has no NTP zone and ErrNTPZoneNotRunning when it is not
	// running (yet). Required unless Skip.
	Locate func() (netip.AddrPort, error)
	// Skip turns the gate off (--skip-timesync): Check is always nil and
	// nothing is polled, as upstream's TimeSyncConfig::Skip.
	Skip bool
	// Client sends the requests (default: no proxy, no keep-alive, no
	// redirects: an NTP zone may vanish or be replaced at any moment).
	Client *http.Client
	// Period is the pause between checks until time is synchronized (1s),
	// SyncedPeriod the pause while it is (5s).
	Period       time.Duration
	SyncedPeriod time.Duration
	// Timeout bounds each request (2s).
	Timeout time.Duration
	// MaxBackoff caps the pause after consecutive requests that got no
	// report, which doubles from the period (10s; never below the
	// period).
	MaxBackoff time.Duration
	// OnChange is called with the new status each time Synced flips or
	// the kind of reason changes (ErrNoNTPZone, ErrNTPZoneNotRunning,
	// ErrUnreachable, ErrNotSynced), so that zones held back say why now;
	// from Run's goroutine and without any lock held.
	OnChange func(Status)
	Log      *slog.Logger
}

// Status is what the watcher last saw. Its JSON is our inventory's view.
type Status struct {
	// Synced: the last check found time synchronized.
	Synced bool `json:"synced"`
	// Released: time was synchronized at least once since the watcher
	// started (or Skipped).
	Released bool `json:"released"`
	Skipped  bool `json:"skipped,omitempty"`
	// Reason says why Synced is false.
	Reason string `json:"reason,omitempty"`
	// NTPAdmin is the address the last check asked.
	NTPAdmin string `json:"ntp_admin,omitempty"`
	// Source, Stratum, Offset (the correction, seconds) and MaxError
	// (seconds) come from the last report received, at ReportAt; they
	// stay when a later check gets none.
	Source   string    `json:"source,omitempty"`
	Stratum  uint8     `json:"stratum,omitempty"`
	Offset   float64   `json:"offset"`
	MaxError float64   `json:"max_error"`
	ReportAt time.Time `json:"report_at,omitzero"`
	// Since is when Synced last became true (zero while it is false);
	// ReleasedAt when it first did.
	Since       time.Time `json:"since,omitzero"`
	ReleasedAt  time.Time `json:"released_at,omitzero"`
	LastChecked time.Time `json:"last_checked,omitzero"`
	// Failures counts consecutive checks that got no report.
	Failures int `json:"failures,omitempty"`

	err error // the reason, for Check
}

// Watcher polls the sled's NTP zone's /timesync and gates the start of
// zones that need synchronized time (see NeedsTimeSync): Check is nil while
// the NTP zone's last answer said time is synchronized.
//
// As upstream's config reconciler (sled-agent/config-reconciler,
// OmicronZones::check_timesync), which asks the NTP zone again on every
// pass and starts no zone that needs time in a pass that finds it
// unsynchronized: a later loss of sync (or of the NTP zone) shows in Status
// and holds back new starts of such zones, but never stops a zone that
// runs. Released and ReleasedAt say whether and when time was first
// synchronized (upstream's once-per-boot ServiceManager::on_time_sync).
type Watcher struct {
	opts Options
	poke chan struct{}

	mu     sync.Mutex
	status Status // guarded by mu
}

// NewWatcher returns a watcher; Run runs it.
func NewWatcher(opts Options) *Watcher {
	opts.Period = cmp.Or(opts.Period, time.Second)
	opts.SyncedPeriod = cmp.Or(opts.SyncedPeriod, 5*time.Second)
	opts.Timeout = cmp.Or(opts.Timeout, 2*time.Second)
	opts.MaxBackoff = cmp.Or(opts.MaxBackoff, 10*time.Second)
	if opts.Client == nil {
		opts.Client = defaultClient
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{opts: opts, poke: make(chan struct{}, 1)}
	if opts.Skip {
		w.status = Status{Skipped: true, Released: true, Reason: "time synchronization is not checked (skipped)"}
	} else {
		w.status = Status{Reason: ErrNotChecked.Error(), err: ErrNotChecked}
	}
	return w
}

var defaultClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{}).DialContext,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Status returns the last status; it never waits for a check.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Check is nil when zones that need synchronized time may start: the last
// check found time synchronized, or the gate is skipped. Otherwise it is a
// *NotSyncedError saying why not. It never waits for a check.
//
// A synchronized answer holds only while Locate still names the NTP zone
// that gave it: a config that has just removed the NTP zone, or one whose
// NTP zone stopped running, is not synchronized even though the check that
// will say so has not run yet (it is asked for at once).
func (w *Watcher) Check() error {
	w.mu.Lock()
	st := w.status
	w.mu.Unlock()
	switch {
	case st.Skipped:
		return nil
	case !st.Synced:
		return &NotSyncedError{Reason: st.Reason, Err: st.err}
	}
	addr, err := w.opts.Locate()
	switch {
	case err != nil:
		w.Poke()
		return &NotSyncedError{Reason: err.Error(), Err: err}
	case addr.String() != st.NTPAdmin:
		w.Poke()
		err := fmt.Errorf("%w: the NTP zone at %s is not yet asked (the last answer was %s's)", ErrNotSynced, addr, st.NTPAdmin)
		return &NotSyncedError{Reason: err.Error(), Err: err}
	}
	return nil
}

// Poke asks for a check now (as when the NTP zone has started). It never
// blocks.
func (w *Watcher) Poke() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Run checks at once, then after every pause or Poke, until ctx ends; it
// returns nil then. With Skip it checks nothing.
func (w *Watcher) Run(ctx context.Context) error {
	if w.opts.Skip {
		<-ctx.Done()
		return nil
	}
	if w.opts.Locate == nil {
		return errors.New("timesync: the watcher has no Locate function")
	}
	for {
		pause := w.checkOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-w.poke:
			t.Stop()
		case <-t.C:
		}
	}
}

// checkOnce asks the NTP zone once, publishes what it found and returns
// the pause before the next check.
func (w *Watcher) checkOnce(ctx context.Context) time.Duration {
	var (
		addr   netip.AddrPort
		report *TimeSync
		reason string
		cause  error
	)
	addr, err := w.opts.Locate()
	if err == nil && !addr.IsValid() {
		err = fmt.Errorf("%w: it has no address", ErrNTPZoneNotRunning)
	}
	if err != nil {
		reason, cause = err.Error(), err
	} else if ts, err := w.fetch(ctx, addr); err != nil {
		if ctx.Err() != nil {
			return 0 // Run is ending: nothing was learned
		}
		reason, cause = err.Error(), err
	} else {
		report = &ts
		if !ts.Sync {
			why := "sync is false"
			if ok, rule := ts.Tracking().Synced(); !ok {
				why = rule
			}
			reason, cause = "NTP zone reports "+why, ErrNotSynced
		}
	}

	now := time.Now()
	w.mu.Lock()
	old := w.status
	st := old
	st.LastChecked = now
	st.NTPAdmin = ""
	if addr.IsValid() {
		st.NTPAdmin = addr.String()
	}
	if report != nil {
		st.Failures = 0
		st.Source = report.Tracking().Source()
		st.Stratum, st.Offset, st.MaxError, st.ReportAt = report.Stratum, report.Correction, report.MaxError, now
	} else if errors.Is(cause, ErrUnreachable) {
		st.Failures++
	} else {
		st.Failures = 0
	}
	st.Synced = cause == nil
	st.Reason, st.err = reason, cause
	switch {
	case st.Synced && !old.Synced:
		st.Since = now
		if !st.Released {
			st.Released, st.ReleasedAt = true, now
		}
	case !st.Synced:
		st.Since = time.Time{}
	}
	w.status = st
	w.mu.Unlock()

	w.logChange(old, st)
	if (st.Synced != old.Synced || kind(st.err) != kind(old.err)) && w.opts.OnChange != nil {
		w.opts.OnChange(st)
	}
	period := w.opts.Period
	if st.Synced {
		period = w.opts.SyncedPeriod
	}
	if st.Failures > 0 {
		return backoff.Backoff{Initial: period, Max: max(w.opts.MaxBackoff, period)}.Delay(st.Failures)
	}
	return period
}

func (w *Watcher) logChange(old, st Status) {
	switch {
	case st.Synced && !old.Synced:
		w.opts.Log.Info("time is synchronized", "ntp_admin", st.NTPAdmin, "source", st.Source, "stratum", st.Stratum, "offset_s", st.Offset, "max_error_s", st.MaxError)
	case !st.Synced && old.Synced:
		w.opts.Log.Warn("time is no longer synchronized; zones keep starting (the gate latches)", "reason", st.Reason)
	case !st.Synced && (kind(st.err) != kind(old.err) || kind(st.err) == nil && st.Reason != old.Reason):
		// Once per kind of reason: the rule's numbers change every check.
		w.opts.Log.Info("time not yet synchronized", "reason", st.Reason, "released", st.Released)
	}
}

// maxAnswerBytes caps what is read of an answer.
const maxAnswerBytes = 64 << 10

// fetch asks ntp-admin at addr for its report, under the request deadline.
// Every error wraps ErrUnreachable.
func (w *Watcher) fetch(ctx context.Context, addr netip.AddrPort) (TimeSync, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	target := "http://" + addr.String() + "/timesync"
	fail := func(format string, args ...any) (TimeSync, error) {
		return TimeSync{}, fmt.Errorf("%w: GET %s: %s", ErrUnreachable, target, fmt.Sprintf(format, args...))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail("%v", err)
	}
	req.Header.Set("api-version", APIVersion)
	req.Header.Set("Accept", "application/json")
	resp, err := w.opts.Client.Do(req)
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // fail names the method and URL already
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fail("no answer within %v", w.opts.Timeout)
		}
		return fail("%v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return fail("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		return fail("%s: %s", resp.Status, msg)
	}
	var wire struct {
		TimeSync
		Sync *bool `json:"sync"` // required: the verdict
	}
	if err := json.Unmarshal(body, &wire); err != nil {
		return fail("the answer is not a TimeSync: %v", err)
	}
	if wire.Sync == nil {
		return fail("the answer has no sync")
	}
	ts := wire.TimeSync
	ts.Sync = *wire.Sync
	return ts, nil
}

// kind is the reason's sentinel, if it has one.
func kind(err error) error {
	for _, k := range []error{ErrNoNTPZone, ErrNTPZoneNotRunning, ErrUnreachable, ErrNotSynced, ErrNotChecked} {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
