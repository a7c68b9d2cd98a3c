package crashtest_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/cli"
	"github.com/sled-agent/sled-agent/internal/crashtest"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// agentEnv makes this test binary the agent: the crash test runs it with
// `run …`, the linux runtime's default image with `zone-service …`, a
// VMM's zone with `vmm-service …` and the data path's service with
// `vpc-service …`.
const agentEnv = "CRASHTEST_RUN_AGENT"

func TestMain(m *testing.M) {
	qemujail.RunIfAsked() // a VMM service's QEMU, shut in
	zoneservicetest.ServeIfAsked()
	if os.Getenv(agentEnv) == "1" || len(os.Args) > 1 && (os.Args[1] == "vmm-service" || os.Args[1] == "vpc-service") {
		os.Exit(cli.Main(os.Args[1:]))
	}
	zoneservicetest.ExitIfService()
	os.Exit(m.Run())
}

// A few iterations in CI, a quarter of them reboots of the host and at
// least one (the last, if none was drawn before); `sled-agent crashtest`
// runs as many as asked.
func TestKilledAgentRecovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the agent with the linux runtime")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("needs btrfs-progs (scripts/setup installs them)")
	}
	res, err := crashtest.Run(t.Context(), crashtest.Options{
		Iterations:      6,
		Crucibles:       4,
		MaxKillDelay:    time.Second,
		ConvergeTimeout: 30 * time.Second,
		AgentEnv:        []string{agentEnv + "=1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, kills %v (of the data path too: %d), reboots %v, convergence p50 %.0f ms, max %.0f ms (after a reboot p50 %.0f ms), VMMs a kill failed %v, VMMs a reboot took down %d",
		res.Seed, res.Kills, res.DataPathKills, res.Reboots, res.ConvergeP50ms, res.ConvergeMaxms, res.RebootConvergeP50ms, res.VMMsFailed, res.VMMsRebooted)
	if n := total(res.Reboots); n == 0 {
		t.Errorf("no reboot in %d iterations", res.Iterations)
	}
	if !res.OK() {
		t.Errorf("leaks %d %v; healthy zones restarted %d %v; ledger problems %d %v; data lost %d %v",
			res.Leaks, res.LeakDetails, res.HealthyRestarts, res.RestartDetails, res.LedgerProblems, res.LedgerDetails, res.DataLost, res.DataLostDetails)
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// This binary, started as a service would be (with a service's mark) and
// with arguments nothing recognises, must not run the tests: the crash
// test's would start an agent whose services start this binary again.
func TestAServiceNeverRunsTheTests(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestKilledAgentRecovers$", "-test.v")
	cmd.Env = append(os.Environ(), supervise.MarkerEnv+"="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "not running the tests") || strings.Contains(string(out), "=== RUN") {
		t.Fatalf("started as a service: %v\n%s", err, out)
	}
}
