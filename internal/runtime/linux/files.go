package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// keepAgentBinary copies the agent binary into the data dir (if it differs
// from the copy there), so the zones' services keep working when the file
// the agent ran from goes away, as `go run`'s does.
func (r *Runtime) keepAgentBinary() error {
	src := r.opts.AgentBinary
	if src == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the agent binary: %w", err)
		}
		src = exe
	}
	dst := filepath.Join(r.opts.DataDir, "bin", "sled-agent")
	r.agent = dst
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("reading the agent binary: %w", err)
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := atomicfile.WriteFile(dst, data, atomicfile.Options{Perm: 0o755, Durable: true}); err != nil {
		return fmt.Errorf("keeping the agent binary: %w", err)
	}
	return nil
}

// nicConfig turns a zone's NIC config into the addresses of its link: in
// its subnet, or, for a port of the VPC data path (vpc), alone with its
// IPv4 gateway, the subnet's first host, as OPTE gives zones.
func nicConfig(nic *sledconfig.NIC, vpc bool) (*zonenet.NIC, error) {
	var out zonenet.NIC
	if nic.MAC != "" {
		mac, err := net.ParseMAC(nic.MAC)
		if err != nil {
			return nil, fmt.Errorf("nic mac: %w", err)
		}
		out.MAC = mac
	}
	add := func(ip, subnet string) error {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return fmt.Errorf("nic ip: %w", err)
		}
		p, err := netip.ParsePrefix(subnet)
		if err != nil {
			return fmt.Errorf("nic subnet: %w", err)
		}
		if !vpc {
			out.Addrs = append(out.Addrs, netip.PrefixFrom(a, p.Bits()))
			return nil
		}
		out.Addrs = append(out.Addrs, netip.PrefixFrom(a, a.BitLen()))
		if a.Is4() {
			out.Gateway = p.Masked().Addr().Next()
		}
		return nil
	}
	v := nic.IPConfig.Value
	if v.IP != "" {
		if err := add(v.IP, v.Subnet); err != nil {
			return nil, err
		}
	}
	for _, p := range []*sledconfig.PrivateIP{v.V4, v.V6} {
		if p != nil {
			if err := add(p.IP, p.Subnet); err != nil {
				return nil, err
			}
		}
	}
	return &out, nil
}

// killNamespaceProcs kills every process whose network namespace is the one
// bound at nsPath, and waits (until ctx ends) for them to go. A missing
// namespace has no processes.
func killNamespaceProcs(ctx context.Context, nsPath string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(nsPath, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("namespace %s: %w", nsPath, err)
	}
	want := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"
	delay := 10 * time.Millisecond
	for {
		byNS, err := procs.walk(ctx)
		if err != nil {
			return err
		}
		pids := byNS[want]
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("processes %v in %s did not exit: %w", pids, nsPath, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// procs shares walks of /proc between the zones being destroyed at once.
var procs procWalker

// procWalker walks /proc for callers that need to know which processes are
// in which network namespace. A caller gets the result of a walk that began
// after it asked, and every caller waiting when a walk begins shares it, so
// destroying many zones at once costs a few walks, not one each.
type procWalker struct {
	mu      sync.Mutex
	waiting []chan walkResult // guarded by mu; callers for the next walk
	running bool              // guarded by mu
}

type walkResult struct {
	byNS map[string][]int // "net:[inode]" → pids
	err  error
}

func (w *procWalker) walk(ctx context.Context) (map[string][]int, error) {
	ch := make(chan walkResult, 1)
	w.mu.Lock()
	w.waiting = append(w.waiting, ch)
	if !w.running {
		w.running = true
		go w.loop()
	}
	w.mu.Unlock()
	select {
	case r := <-ch:
		return r.byNS, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// loop walks while anyone waits. It ends when nobody does; walking /proc
// is local and bounded, so it never waits on anything else.
func (w *procWalker) loop() {
	for {
		w.mu.Lock()
		batch := w.waiting
		w.waiting = nil
		if len(batch) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		byNS, err := namespacePIDs()
		for _, ch := range batch {
			ch <- walkResult{byNS, err} // buffered: never blocks
		}
	}
}

// namespacePIDs maps every network namespace (as /proc/<pid>/ns/net reads)
// to its processes.
func namespacePIDs() (map[string][]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, err
	}
	byNS := map[string][]int{}
	self := os.Getpid()
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			// Never ourselves: /proc shows a process's namespace as its main
			// thread's, and a thread that entered a zone's namespace and was
			// then discarded by the Go runtime may be the main one.
			continue
		}
		if link, err := os.Readlink("/proc/" + n + "/ns/net"); err == nil {
			byNS[link] = append(byNS[link], pid)
		}
	}
	return byNS, nil
}

// prepareRunDir creates the run dir and, if asked, mounts a tmpfs on it
// unless it is on one already.
func prepareRunDir(dir string, tmpfs bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if !tmpfs {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"); err != nil {
		return fmt.Errorf("mounting a tmpfs on the run dir %s: %w", dir, err)
	}
	// Ours, for ReleaseRunDir.
	if err := os.WriteFile(filepath.Join(dir, runDirMark), nil, 0o600); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	return nil
}
