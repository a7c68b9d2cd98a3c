package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
)

// The linux runtime's data path runs as a service of its own, under runit's
// runsv as the zones' services do, in the sled's network namespace: it
// outlives the agent, so that guests' traffic flows while the agent is
// away, and runsv restarts it when it dies (it is then given everything
// again by the agent). Its service directory is <run-dir>/<tag>-vpcd,
// beside the zones', and its API <run-dir>/<tag>-vpcd.sock.

// VPCServiceDir is the data path's runit service directory.
func VPCServiceDir(cfg Config) string {
	return filepath.Join(cmp.Or(cfg.RunDir, DefaultRunDir), cmp.Or(cfg.ZoneTag, DefaultZoneTag)+"-vpcd")
}

// startVPCService prepares the data path's service (the agent binary the
// zones run, with its arguments) and starts its runsv if none runs.
func (a *Agent) startVPCService(ctx context.Context) error {
	bin := filepath.Join(a.cfg.DataDir, "bin", "sled-agent") // the linux runtime keeps it
	argv := []string{bin, "vpc-service", "--underlay", a.underlay.String(), "--socket", a.vpcSocket()}
	dir := VPCServiceDir(a.cfg)
	if err := supervise.PrepareDirect(dir, argv, nil); err != nil {
		return fmt.Errorf("preparing the data path's service: %w", err)
	}
	p, err := supervise.StartContext(ctx, dir)
	if err != nil {
		return fmt.Errorf("starting the data path's service: %w", err)
	}
	p.Close()
	return nil
}

// stopVPCService stops the data path's service, if there is one, and
// removes its directory and socket (teardown).
func stopVPCService(ctx context.Context, cfg Config) (string, error) {
	dir := VPCServiceDir(cfg)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err := supervise.Stop(ctx, dir); err != nil {
		return "", fmt.Errorf("stopping the data path's service: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	os.Remove(VPCSocket(cfg))
	return "the VPC data path's service " + dir, nil
}
