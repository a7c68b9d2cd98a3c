package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// escapeByte leaves the console: Ctrl-], as telnet's and oxide instance
// serial console's.
const escapeByte = 0x1d

// historyChunk is how much serial history one request asks for.
const historyChunk = 256 << 10

func newVMMConsoleCmd(g *globals) *cobra.Command {
	var history bool
	var mostRecent uint64
	var addr string
	cmd := &cobra.Command{
		Use:   "console ID",
		Short: "Attach to a VMM's serial console (com1); Ctrl-] leaves. --history prints what it said and exits",
		Long: `Connects to the serial console of the VMM's Propolis API (GET
/instance/serial, a websocket) at its propolis_addr, or where the agent
reaches its service (with the sim runtime, on loopback in the agent). The last
--most-recent bytes of output are shown first. When standard input is a
terminal it is put in raw mode, so that every key goes to the guest; Ctrl-]
leaves. With --history, the console's output held so far (GET
/instance/serial/history) is printed and the command exits.`,
		Args:        cobra.ExactArgs(1),
		Annotations: map[string]string{noOutputFlag: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := g.setup()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if addr == "" {
				v, err := findVMM(ctx, c, args[0])
				if err != nil {
					return err
				}
				addr = serviceAddr(v)
			}
			pc := propolisapi.NewClient(addr)
			if history {
				return printHistory(ctx, pc, cmd.OutOrStdout())
			}
			return console(ctx, pc, propolisapi.SerialMostRecent(mostRecent), cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&history, "history", false, "print the console's output held so far and exit")
	f.Uint64Var(&mostRecent, "most-recent", 16<<10, "bytes of earlier output to show on attaching")
	f.StringVar(&addr, "propolis-addr", "", "[addr]:port of the VMM's Propolis API (default: found from the agent)")
	return cmd
}

// printHistory writes all the console output held: from the oldest byte
// still held (most_recent beyond the start reads from the start) to the
// end, a chunk at a time.
func printHistory(ctx context.Context, pc *propolisapi.Client, w io.Writer) error {
	data, end, err := pc.SerialHistory(ctx, propolisapi.SerialMostRecent(1<<62), historyChunk)
	for err == nil && len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return err
		}
		data, end, err = pc.SerialHistory(ctx, propolisapi.SerialFromStart(end), historyChunk)
	}
	return err
}

// console copies the console's output to out and in to the guest until
// in gives Ctrl-] or the console ends. A terminal in is put in raw mode
// meanwhile. When in ends without Ctrl-], output is still shown until the
// console ends or ctx does.
func console(ctx context.Context, pc *propolisapi.Client, from propolisapi.SerialOffset, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := pc.SerialConnect(ctx, from)
	if err != nil {
		return err
	}
	defer conn.Close()
	if f, ok := in.(*os.File); ok {
		restore, isTerm, err := rawMode(int(f.Fd()))
		if err != nil {
			return err
		}
		defer restore()
		if isTerm {
			fmt.Fprint(out, "[connected; Ctrl-] leaves]\r\n")
		}
	}
	done := make(chan error, 2)
	go func() { done <- copyOutput(ctx, conn, out) }()
	go func() { done <- copyInput(ctx, conn, in) }()
	for {
		select {
		case err := <-done:
			if errors.Is(err, errLeave) {
				return nil
			}
			if errors.Is(err, io.EOF) && !errors.Is(err, errInputEnded) {
				// The console ended (the VM stopped).
				return nil
			}
			if errors.Is(err, errInputEnded) {
				continue // keep showing output
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var (
	errLeave      = errors.New("Ctrl-] pressed")
	errInputEnded = fmt.Errorf("input ended: %w", io.EOF)
)

// copyOutput writes the console's output to out until it ends.
func copyOutput(ctx context.Context, conn *propolisapi.SerialConn, out io.Writer) error {
	for {
		p, err := conn.ReadOutput(ctx)
		if err != nil {
			return err
		}
		if _, err := out.Write(p); err != nil {
			return err
		}
	}
}

// copyInput sends in to the guest until Ctrl-] (errLeave) or its end
// (errInputEnded). A read of in cannot be interrupted: when the console
// ends first, the goroutine ends with the process.
func copyInput(ctx context.Context, conn *propolisapi.SerialConn, in io.Reader) error {
	buf := make([]byte, 4096)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			p := buf[:n]
			i := bytes.IndexByte(p, escapeByte)
			if i >= 0 {
				p = p[:i]
			}
			if len(p) > 0 {
				if werr := conn.WriteInput(ctx, p); werr != nil {
					return werr
				}
			}
			if i >= 0 {
				return errLeave
			}
		}
		if errors.Is(err, io.EOF) {
			return errInputEnded
		}
		if err != nil {
			return fmt.Errorf("reading input: %w", err)
		}
	}
}

// rawMode puts the terminal fd in raw mode (as cfmakeraw) and returns what
// restores it; on a non-terminal it does nothing (isTerm false).
func rawMode(fd int) (restore func(), isTerm bool, err error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return func() {}, false, nil // not a terminal
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, true, fmt.Errorf("raw terminal mode: %w", err)
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, true, nil
}
