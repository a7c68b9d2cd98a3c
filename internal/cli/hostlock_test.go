package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/syncbuf"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// runAgentEnv makes this test binary the sled-agent binary: the tests run it
// with `run …`, `teardown …` and `dev …`, and the linux runtime's images
// with `zone-service …`, `ntp-zone …` and `vmm-service …`, and a VMM
// service its QEMU through qemujail, as cmd/sled-agent does.
const runAgentEnv = "CLI_TEST_RUN_AGENT"

func TestMain(m *testing.M) {
	qemujail.RunIfAsked()
	standin.RunIfAsked()
	if argv, ok, _ := supervise.RunArgs(); ok && len(argv) > 1 && (argv[1] == "ntp-zone" || argv[1] == "vmm-service" || argv[1] == "vpc-service") {
		supervise.SetTitle(argv)
		os.Exit(Main(argv[1:]))
	}
	zoneservicetest.ServeIfAsked()
	if os.Getenv(runAgentEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	zoneservicetest.ExitIfService()
	os.Exit(m.Run())
}

// exitDeadline is how long a refused second agent may take to exit: the
// contract is a few seconds; this is the hang detector.
const exitDeadline = 10 * time.Second

// The outside check of one agent per host: a second `sled-agent run
// --runtime linux` with another data dir, and a `sled-agent teardown` of
// that data dir, exit non-zero while the first runs, naming it; the first's
// zones keep their processes.
func TestSecondLinuxAgentOnTheHostExits(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the agent with the linux runtime")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("needs btrfs-progs: the zone's datasets are on a btrfs pool (scripts/setup installs them)")
	}
	b := make([]byte, 3)
	rand.Read(b)
	tag := "zt" + hex.EncodeToString(b)
	dirA, dirB, runDir := t.TempDir(), t.TempDir(), t.TempDir()
	// The flags of an agent of the data dir that teardown takes too; run
	// adds its own (runFlags).
	flags := func(dataDir string) []string {
		return []string{"--runtime", "linux", "--data-dir", dataDir, "--run-dir", runDir, "--zone-tag", tag, "--netns-prefix", tag + "-", "--vdev-dir", filepath.Join(dataDir, "vdev")}
	}
	runFlags := func(dataDir string) []string {
		return append(flags(dataDir), "--skip-timesync", "--underlay-ip", "fd00:1122:3344:1f2::1")
	}
	cfgA := agent.Config{DataDir: dirA, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: tag + "-", VdevDir: filepath.Join(dirA, "vdev"), UnderlayIP: "fd00:1122:3344:1f2::1"}
	// Registered first, run last: the first agent is gone by then.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := agent.Teardown(ctx, cfgA, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := btrfs.ReleaseUnder(ctx, dirA); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := agent.RemoveHostLock(tag); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	addrA := freeAddr(t)
	first, firstOut := startBinary(t, append([]string{"run", "--listen", addrA, "--ddm-url", ""}, runFlags(dirA)...)...)
	c, err := client.New("http://" + addrA)
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = 5 * time.Second
	z := sledconfigtest.OwnPools(tag, sledconfigtest.Crucible(0x74))[0]
	z.ZoneType.Address = "[fd00:1122:3344:1f2::74]:32345"
	if err := btrfs.MakeVdevs(cfgA.VdevDir, sledconfigtest.VdevNames(tag+"-", z)...); err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(sledconfigtest.ConfigOnVdevs(1, tag+"-", z))
	if err != nil {
		t.Fatal(err)
	}
	svc := filepath.Join(runDir, tag, z.Name())
	var pid int
	deadline := time.Now().Add(waitDeadline)
	for {
		if err = c.PutConfig(t.Context(), doc); err == nil {
			if st, serr := supervise.Status(svc); serr == nil && st.Up {
				pid = st.PID
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first agent's zone did not come up: %v\n%s", err, firstOut)
		}
		time.Sleep(waitInterval)
	}

	holder := fmt.Sprintf("pid %d, data dir %s", first.Process.Pid, dirA)
	for _, args := range [][]string{
		append([]string{"run", "--listen", freeAddr(t), "--ddm-url", ""}, runFlags(dirB)...),
		append([]string{"teardown", "--yes"}, flags(dirB)...),
	} {
		cmd, out := startBinary(t, args...)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Errorf("sled-agent %s: %v, want a non-zero exit\n%s", args[0], err, out)
			}
			t.Logf("sled-agent %s: %v: %s", args[0], err, strings.TrimSpace(out.String()))
			if !strings.Contains(out.String(), holder) {
				t.Errorf("sled-agent %s says\n%s\nwant it to name %q", args[0], out, holder)
			}
		case <-time.After(exitDeadline):
			t.Errorf("sled-agent %s beside a running agent of the same tag still runs after %s\n%s", args[0], exitDeadline, out)
			cmd.Process.Kill()
			<-exited
		}
	}

	if st, err := supervise.Status(svc); err != nil || !st.Up || st.PID != pid {
		t.Errorf("the first agent's zone service was pid %d, is %+v (%v)", pid, st, err)
	}
	first.Process.Signal(syscall.SIGTERM)
}

// startBinary starts this test binary as the sled-agent binary with args;
// it is killed when the test ends if it still runs. out collects its
// output.
func startBinary(t *testing.T, args ...string) (cmd *exec.Cmd, out *syncbuf.Buffer) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out = &syncbuf.Buffer{}
	cmd = exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), runAgentEnv+"=1")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(exitDeadline):
				cmd.Process.Kill()
				<-done
			}
		}
	})
	return cmd, out
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
