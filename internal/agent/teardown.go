package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
)

// teardownZoneTimeout bounds the teardown of one zone.
const teardownZoneTimeout = time.Minute

// Teardown destroys every zone the configured runtime holds for this data
// dir, then every leftover part of this data dir's sled that belongs to no
// zone, and returns one line per thing removed. It is the explicit operator
// command for an empty sled: stopping the agent never does this. It takes
// the data dir and, for the linux runtime, the host's zones of its tag, so it
// refuses to run beside an agent of either. Within those it removes only what
// is proven this sled's: parts of another sled (another data dir) are logged
// as not ours and left alone. With the linux runtime it then releases the
// sled's storage: the pools under its pool root are unmounted and the loop
// devices of its vdev files detached (nothing is formatted, and a real
// disk is only unmounted), and the tmpfs it mounted on the run dir is
// unmounted. The ledger is left as it is; an agent started later creates the
// ledgered zones again, on its pools as they were.
func Teardown(ctx context.Context, cfg Config, log *slog.Logger) ([]string, error) {
	r, err := TeardownReport(ctx, cfg, log)
	return r.Removed, err
}

// TeardownResult is what a teardown removed, and what it left and why,
// one line each, for people.
type TeardownResult struct {
	Removed, Left []string
}

// TeardownReport is Teardown, saying also what it left and why.
func TeardownReport(ctx context.Context, cfg Config, log *slog.Logger) (TeardownResult, error) {
	done, left, err := teardown(ctx, cfg, log)
	return TeardownResult{Removed: done, Left: left}, err
}

func teardown(ctx context.Context, cfg Config, log *slog.Logger) (done, left []string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir == "" {
		return nil, nil, errors.New("data-dir is required")
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.SimFaults != "" {
		return nil, nil, errors.New("teardown takes no sim faults")
	}
	lock, err := lockFor(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	defer lock.Close()
	// The sled whose parts these are (the linux runtime goes by it); a
	// data dir that has none yet gets one, which owns nothing outside it.
	if cfg.Runtime == "linux" {
		if cfg.SledID, err = sledIdentity(cfg.DataDir, cfg.SledID); err != nil {
			return nil, nil, err
		}
	}
	rt, err := newRuntime(cfg, log, nil)
	if err != nil {
		return nil, nil, err
	}
	// The data path's service first: it holds the guests' taps' sockets.
	if cfg.Runtime == "linux" {
		vctx, cancel := context.WithTimeout(ctx, time.Minute)
		stopped, err := stopVPCService(vctx, cfg)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		if stopped != "" {
			done = append(done, stopped)
		}
	}
	// The probes' zones, with either runtime: their NICs' host ends were
	// the data path's.
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	removed, err := probeZones(cfg).RemoveAll(pctx)
	cancel()
	done = append(done, removed...)
	if err != nil {
		return done, nil, fmt.Errorf("removing the probes' zones: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	zones, err := rt.List(lctx)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("listing zones: %w", err)
	}
	var errs []error
	for _, z := range zones {
		dctx, cancel := context.WithTimeout(ctx, teardownZoneTimeout)
		err := rt.Destroy(dctx, z.Name)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("zone destroyed", "zone", z.Name)
		done = append(done, "zone "+z.Name)
	}
	if sw, ok := rt.(reconciler.Sweeper); ok && len(errs) == 0 {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		left, err := sw.Sweep(sctx)
		cancel()
		done = append(done, left...)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing leftovers: %w", err))
		}
	}
	// What the storage backend attached, once no zone is left on it: its
	// pools unmounted, the loop devices of its vdev files detached. A
	// later agent attaches and mounts them again, as they are.
	if cfg.Runtime == "linux" && len(errs) == 0 {
		released, err := releaseStorage(ctx, cfg, log)
		done = append(done, released...)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing storage: %w", err))
		}
	}
	// The runtime's own directories (the linux runtime's cgroup of its tag),
	// if nothing is left in them.
	if d, ok := rt.(interface{ RemoveEmptyDirs() }); ok && len(errs) == 0 {
		d.RemoveEmptyDirs()
	}
	// The tmpfs the runtime mounted on the run dir, last: what was in it
	// went with the zones.
	if d, ok := rt.(interface {
		ReleaseRunDir() (string, string, error)
	}); ok && len(errs) == 0 {
		released, why, err := d.ReleaseRunDir()
		if released != "" {
			done = append(done, released)
		}
		if why != "" {
			left = append(left, why)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return done, left, errors.Join(errs...)
}

// releaseStorage unmounts the pools under cfg's pool root and detaches the
// loop devices of its vdev files (btrfs.Backend.Release). Each command and
// syscall of it runs under the backend's deadline; the whole takes as long
// as the sled has disks.
func releaseStorage(ctx context.Context, cfg Config, log *slog.Logger) ([]string, error) {
	b, err := newBtrfs(cfg, log)
	if err != nil {
		return nil, err
	}
	return b.Release(ctx)
}
