package bench

// The VPC benchmark's guests: a TCP stream and UDP round trips from guest A
// to guest B of one way.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// vpcGuests is one way's topology and the guests' sockets: B's listener
// and UDP echo, A's stream and UDP client.
type vpcGuests struct {
	t        *vpcTopology
	ln       net.Listener
	echo     *net.UDPConn
	conn     net.Conn
	client   *net.UDPConn
	received chan int64
	// accepted is B's end of the stream, for close to end B's read.
	accepted chan net.Conn
	req, buf []byte
}

// streamGrace bounds how long the stream's writes may wait past its
// duration, and how long B may take to read what is in flight after it:
// a hang detector, for a data path that stops carrying the stream.
const streamGrace = 30 * time.Second

// openGuests opens the guests' sockets on t, which the guests own from
// then on (close closes both), and connects A's stream to B.
func openGuests(ctx context.Context, t *vpcTopology) (g *vpcGuests, err error) {
	g = &vpcGuests{t: t, received: make(chan int64, 1), accepted: make(chan net.Conn, 1), req: make([]byte, 64), buf: make([]byte, 2048)}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if err := zonenet.RunInPath(t.gB, func() (err error) {
		if g.ln, err = net.Listen("tcp4", vpcGuestB+":5001"); err != nil {
			return err
		}
		g.echo, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(vpcGuestB+":5002")))
		return err
	}); err != nil {
		return g, err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := g.echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			g.echo.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	go func() {
		c, err := g.ln.Accept()
		if err != nil {
			g.received <- -1
			return
		}
		g.accepted <- c
		n, _ := io.Copy(io.Discard, c)
		g.received <- n
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := zonenet.RunInPath(t.gA, func() (err error) {
			// The socket first: only the dial is tried again, as the
			// listener accepts one stream.
			if g.client == nil {
				if g.client, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(vpcGuestA+":5003"))); err != nil {
					return err
				}
			}
			g.conn, err = (&net.Dialer{Timeout: time.Second}).Dial("tcp4", vpcGuestB+":5001")
			return err
		})
		if err == nil {
			return g, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return g, fmt.Errorf("guest B not reachable from guest A: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (g *vpcGuests) close() {
	select {
	case c := <-g.accepted:
		c.Close()
	default:
	}
	if g.conn != nil {
		g.conn.Close()
	}
	if g.ln != nil {
		g.ln.Close()
	}
	if g.client != nil {
		g.client.Close()
	}
	if g.echo != nil {
		g.echo.Close()
	}
	g.t.close()
}

// stream writes A's stream for d, then closes it, and times until B has
// read all of it.
func (g *vpcGuests) stream(ctx context.Context, d time.Duration) (VPCPath, error) {
	var p VPCPath
	chunk := make([]byte, 64<<10)
	cpu0 := cpuTime()
	start := time.Now()
	g.conn.SetWriteDeadline(start.Add(d + streamGrace))
	for time.Since(start) < d && ctx.Err() == nil {
		if _, err := g.conn.Write(chunk); err != nil {
			return p, err
		}
	}
	g.conn.Close()
	var got int64
	select {
	case got = <-g.received:
	case <-time.After(streamGrace):
		return p, fmt.Errorf("guest B did not read the stream's end within %s", streamGrace)
	case <-ctx.Done():
		return p, ctx.Err()
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	gbit := float64(got) * 8 / 1e9
	p.StreamGbps = gbit / elapsed.Seconds()
	if gbit > 0 {
		p.CPUSecondsPerGbit = cpu.Seconds() / gbit
	}
	return p, ctx.Err()
}

// roundTrip sends A's 64-byte request to B's echo and times until its
// answer (given up after a second).
func (g *vpcGuests) roundTrip() (time.Duration, error) {
	t0 := time.Now()
	if _, err := g.client.WriteToUDPAddrPort(g.req, netip.MustParseAddrPort(vpcGuestB+":5002")); err != nil {
		return 0, err
	}
	g.client.SetReadDeadline(t0.Add(time.Second))
	if _, _, err := g.client.ReadFromUDPAddrPort(g.buf); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// interleave times requests round trips of each way, in rounds: each
// round takes every way in turn for its share of the requests (the first
// requests%rounds rounds one more), starting one way further on each
// round. A round trip that fails is not timed. The durations come back per
// way, in the order ways were given.
func interleave(ctx context.Context, ways []func() (time.Duration, error), requests, rounds int) [][]time.Duration {
	out := make([][]time.Duration, len(ways))
	if len(ways) == 0 || requests <= 0 {
		return out
	}
	rounds = max(1, min(rounds, requests))
	for r := range rounds {
		n := requests / rounds
		if r < requests%rounds {
			n++
		}
		for k := range ways {
			i := (r + k) % len(ways)
			for range n {
				if ctx.Err() != nil {
					return out
				}
				if d, err := ways[i](); err == nil {
					out[i] = append(out[i], d)
				}
			}
		}
	}
	return out
}
