package simguest

import (
	"context"
	"fmt"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// What the simulated guest prints on its console, every line ended by
// "\r\n" as a serial console's are.
//
// On every boot its firmware speaks when it starts, and its kernel, then a
// line ReadyPrefix and the MAC of its first NIC as it becomes Running.
// While it runs it echoes every line of input back, and a reboot or a
// stop says so. A guest found running (Options.Running) prints only the
// READY line.
const (
	// ReadyPrefix starts the line that says the guest is up; the MAC of
	// its first NIC (the one at the lowest PCI path) follows, lowercase
	// with colons, or NoMAC.
	ReadyPrefix = "SIMULATED-GUEST READY mac="
	// NoMAC stands for the MAC of a guest without a NIC.
	NoMAC = "none"
)

// maxLine is the longest line of input echoed as one: a longer one is
// echoed in pieces.
const maxLine = 4096

func readyLine(mac string) []byte {
	return []byte(ReadyPrefix + mac + "\r\n")
}

// firmwareLines are what OVMF says as it boots a guest's disk.
func firmwareLines() []byte {
	return []byte("BdsDxe: loading Boot0001 \"UEFI Misc Device\" from PciRoot(0x0)/Pci(0x10,0x0)\r\n" +
		"BdsDxe: starting Boot0001 \"UEFI Misc Device\" from PciRoot(0x0)/Pci(0x10,0x0)\r\n")
}

// kernelLines are a few lines of the guest's kernel booting on board, and
// the READY line.
func kernelLines(b spec.Board, mac string) []byte {
	s := "[    0.000000] Linux version 6.1.0-sim (simulated guest)\r\n" +
		"[    0.000000] Command line: console=ttyS0\r\n" +
		fmt.Sprintf("[    0.104512] smpboot: Allowing %d CPUs, 0 hotplug CPUs\r\n", b.CPUs) +
		fmt.Sprintf("[    0.213077] Memory: %dK available\r\n", b.MemoryMiB*1024)
	if mac != NoMAC {
		s += fmt.Sprintf("[    0.734260] virtio_net virtio0 eth0: MAC %s\r\n", mac)
	}
	s += "[    1.021934] Run /init as init process\r\n"
	return append([]byte(s), readyLine(mac)...)
}

// input is the console's input: a running guest echoes each line back
// (ended by "\r", "\n" or "\r\n"); one that does not run reads nothing, and
// its input is lost, as a serial port's is.
func (g *Guest) input(ctx context.Context, p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st.State != propolisapi.StateRunning {
		g.line, g.lastCR = nil, false
		return len(p), nil
	}
	var out []byte
	for _, c := range p {
		switch {
		case c == '\n' && g.lastCR:
			// The second half of "\r\n".
		case c == '\r' || c == '\n':
			out = append(append(out, g.line...), '\r', '\n')
			g.line = g.line[:0]
		default:
			g.line = append(g.line, c)
			if len(g.line) == maxLine {
				out = append(append(out, g.line...), '\r', '\n')
				g.line = g.line[:0]
			}
		}
		g.lastCR = c == '\r'
	}
	g.console.Append(out)
	return len(p), nil
}
