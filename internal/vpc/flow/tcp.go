package flow

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is which way a packet crosses the port: Out from the guest, In
// to it (OPTE's Direction).
type Direction uint8

const (
	Out Direction = iota
	In
)

func (d Direction) String() string {
	if d == In {
		return "in"
	}
	return "out"
}

// TCPFlags are a TCP segment's flag bits, as on the wire.
type TCPFlags uint8

const (
	FIN TCPFlags = 1 << iota
	SYN
	RST
	PSH
	ACK
)

// has reports whether every flag of want is set (bitflags' contains).
func (f TCPFlags) has(want TCPFlags) bool { return f&want == want }

// TCPState is a TCP connection's state as the port sees it from the guest's
// side (opte-api's TcpState, crates/opte-api/src/tcp.rs:16).
type TCPState uint8

const (
	Closed TCPState = iota
	Listen
	SynSent
	SynRcvd
	Established
	CloseWait
	LastAck
	FinWait1
	FinWait2
	TimeWait
)

var tcpStateNames = [...]string{
	Closed: "CLOSED", Listen: "LISTEN", SynSent: "SYN_SENT", SynRcvd: "SYN_RCVD",
	Established: "ESTABLISHED", CloseWait: "CLOSE_WAIT", LastAck: "LAST_ACK",
	FinWait1: "FIN_WAIT_1", FinWait2: "FIN_WAIT_2", TimeWait: "TIME_WAIT",
}

func (s TCPState) String() string {
	if int(s) < len(tcpStateNames) {
		return tcpStateNames[s]
	}
	return fmt.Sprintf("TCPState(%d)", uint8(s))
}

const (
	// TCPIncipientTTL is how long a flow may idle in the handshake (or in
	// LAST_ACK), OPTE's INCIPIENT_EXPIRE_SECS (lib/opte/src/engine/tcp.rs:25):
	// short, so that unanswered SYNs do not hold slots.
	TCPIncipientTTL = 5 * time.Second
	// TCPTimeWaitTTL is how long a closing flow may idle, OPTE's
	// TIME_WAIT_EXPIRE_SECS (tcp.rs:33).
	TCPTimeWaitTTL = 120 * time.Second
	// TCPKeepaliveTTL is how long an established flow may idle, OPTE's
	// KEEPALIVE_EXPIRE_SECS (tcp.rs:40): longer than the 2 h keepalive
	// probes of Linux and illumos take to fail.
	TCPKeepaliveTTL = 8000 * time.Second
)

// TCPTTL is how long a flow in state s may idle, OPTE's TcpExpiry
// (lib/opte/src/engine/port/mod.rs:3240-3259). A closed flow expires at the
// next sweep.
func TCPTTL(s TCPState) time.Duration {
	switch s {
	case TimeWait, CloseWait, FinWait1, FinWait2:
		return TCPTimeWaitTTL
	case SynSent, SynRcvd, Listen, LastAck:
		return TCPIncipientTTL
	case Established:
		return TCPKeepaliveTTL
	default:
		return 0
	}
}

// Misbehaved flows (stuck in the handshake or in a close) are evicted
// before idle established ones, on a scale between these
// (port/mod.rs:3280-3282).
const (
	misbehavedMin = MinEvictable + 1
	misbehavedMax = MaxEvictable - 1
)

// TCPEviction is how eligible a flow in state s, idle for idle, is for
// eviction from a full table (port/mod.rs:3261-3342): a closing flow once
// idle past the incipient TTL, more so as it nears its own TTL; a handshake
// past half its TTL, likewise; an established flow idle a whole DefaultTTL,
// at the lowest priority; a closed one at once; others never.
func TCPEviction(s TCPState, idle time.Duration) Priority {
	ms := uint64(idle.Milliseconds())
	incipient := uint64(TCPIncipientTTL.Milliseconds())
	switch s {
	case TimeWait, CloseWait, FinWait1, FinWait2:
		if ms > incipient {
			return lerp(incipient, misbehavedMin, uint64(TCPTimeWaitTTL.Milliseconds()), misbehavedMax, ms)
		}
		return Protected
	case SynSent, SynRcvd, Listen, LastAck:
		if mid := incipient / 2; ms > mid {
			return lerp(mid, misbehavedMin, incipient, misbehavedMax, ms)
		}
		return Protected
	case Established:
		if idle >= DefaultTTL {
			return MinEvictable
		}
		return Protected
	default:
		return MaxEvictable
	}
}

// lerp places delta between start and end on the priority scale lo..hi,
// clamped, in 16-bit fixed point rounded to nearest (OPTE's priority_lerp,
// lib/opte/src/engine/flow_table.rs:716-763). start < end and lo <= hi.
func lerp(start uint64, lo Priority, end uint64, hi Priority, delta uint64) Priority {
	switch {
	case delta <= start:
		return lo
	case delta >= end:
		return hi
	}
	const scale = 16
	frac := ((delta - start) << scale) / (end - start)
	fixed := uint64(hi-lo) * frac
	step := fixed >> scale
	if fixed&(1<<scale-1) >= 1<<(scale-1) {
		step++
	}
	return lo + Priority(step)
}

// ErrUnexpectedSegment is a segment the tracker has no transition for in the
// flow's state. OPTE lets it pass on a flow it knows, leaving the state as it
// was, and refuses it as the first packet of a flow
// (port/mod.rs:2230-2233, 2349-2361).
var ErrUnexpectedSegment = errors.New("unexpected TCP segment")

// ErrNewFlow is a SYN on a flow whose state does not expect one: an
// endpoint reused the 4-tuple before the port let the old connection go.
// The old flow's state is dropped and the packet starts a new flow
// (tcp_state.rs:540-563, port/mod.rs:2326-2344).
var ErrNewFlow = errors.New("TCP flow reopened by an endpoint")

// SegmentError is a segment the tracker did not take; it matches
// ErrUnexpectedSegment or ErrNewFlow.
type SegmentError struct {
	Dir   Direction
	State TCPState // the flow's state, unchanged
	Flags TCPFlags
	Err   error
}

func (e *SegmentError) Error() string {
	return fmt.Sprintf("%v: direction %v, state %v, flags %#x", e.Err, e.Dir, e.State, uint8(e.Flags))
}

func (e *SegmentError) Unwrap() error { return e.Err }

// TCPFlow tracks one TCP connection's state from its segments, as OPTE's
// TcpFlowState (lib/opte/src/engine/tcp_state.rs) does. It exists to expire
// flows as soon as their connection ends, not to police TCP: the guest's
// stack decides what is valid. The zero value is a Closed flow. It is not
// safe for concurrent use; TCPEntry is.
type TCPFlow struct {
	state                TCPState
	guestSeq, guestAck   uint32
	remoteSeq, remoteAck uint32
	has                  uint8 // which of the four above were seen
}

const (
	hasGuestSeq = 1 << iota
	hasGuestAck
	hasRemoteSeq
	hasRemoteAck
)

// State is the connection's state.
func (f *TCPFlow) State() TCPState { return f.state }

// Process moves the state machine on one segment going dir with the given
// flags, sequence and acknowledgement numbers (tcp_state.rs:501-584), and
// returns the new state. A segment with no transition leaves the state as
// it was and returns a *SegmentError: ErrNewFlow if it carries SYN,
// ErrUnexpectedSegment if not. The segment's numbers are recorded either way.
func (f *TCPFlow) Process(dir Direction, flags TCPFlags, seq, ack uint32) (TCPState, error) {
	cur := f.state
	var next TCPState
	var ok bool
	if dir == In {
		next, ok = f.in(flags, ack)
		f.remoteSeq = seq
		f.has |= hasRemoteSeq
		if flags.has(ACK) {
			f.remoteAck = ack
			f.has |= hasRemoteAck
		}
	} else {
		next, ok = f.out(flags)
		f.guestSeq = seq
		f.has |= hasGuestSeq
		if flags.has(ACK) {
			f.guestAck = ack
			f.has |= hasGuestAck
		}
	}
	if !ok {
		err := ErrUnexpectedSegment
		if flags.has(SYN) {
			err = ErrNewFlow
		}
		return cur, &SegmentError{Dir: dir, State: cur, Flags: flags, Err: err}
	}
	f.state = next
	return next, nil
}

// acksGuestFIN reports whether ack covers the guest's FIN: the last sequence
// number the guest sent, plus one.
func (f *TCPFlow) acksGuestFIN(ack uint32) bool {
	return f.has&hasGuestSeq != 0 && ack == f.guestSeq+1
}

// in is the transition on a segment from the remote side
// (tcp_state.rs:138-348). Flag tests follow OPTE's: has(A|B) needs both.
func (f *TCPFlow) in(flags TCPFlags, ack uint32) (TCPState, bool) {
	if flags.has(RST) {
		return Closed, true
	}
	switch f.state {
	case Closed:
		// An ACK: data on a connection the port forgot, or a SYN+ACK
		// after the SYN's entry expired; either way it is established.
		if flags.has(ACK) {
			return Established, true
		}
		if flags.has(SYN) {
			return Listen, true
		}
	case Listen:
		if flags.has(SYN) {
			return Listen, true
		}
	case SynSent:
		if flags.has(SYN | ACK) {
			return Established, true
		}
	case SynRcvd:
		if flags.has(ACK) {
			return Established, true
		}
		if flags.has(SYN) {
			return SynRcvd, true
		}
	case Established:
		if flags.has(FIN) {
			return CloseWait, true
		}
		if flags.has(SYN) {
			return 0, false
		}
		return Established, true
	case CloseWait:
		if flags&(FIN|ACK) != 0 {
			return CloseWait, true
		}
	case LastAck:
		if flags.has(ACK) {
			if f.acksGuestFIN(ack) {
				return Closed, true
			}
			return LastAck, true
		}
	case FinWait1:
		if flags.has(FIN | ACK) {
			return TimeWait, true
		}
		if flags.has(ACK) && f.acksGuestFIN(ack) {
			return FinWait2, true
		}
		if flags.has(ACK) {
			return FinWait1, true
		}
	case FinWait2:
		if flags.has(FIN) && f.acksGuestFIN(ack) {
			return TimeWait, true
		}
		if flags.has(ACK) {
			return FinWait2, true
		}
	case TimeWait:
		if flags.has(FIN) || flags.has(ACK) {
			return TimeWait, true
		}
	}
	return 0, false
}

// out is the transition on a segment from the guest (tcp_state.rs:354-489).
func (f *TCPFlow) out(flags TCPFlags) (TCPState, bool) {
	if flags.has(RST) {
		return Closed, true
	}
	switch f.state {
	case Closed:
		if flags.has(SYN) {
			return SynSent, true
		}
		if flags.has(ACK) {
			return Established, true
		}
	case Listen:
		if flags.has(SYN | ACK) {
			return SynRcvd, true
		}
	case SynSent:
		if flags.has(SYN) {
			return SynSent, true
		}
	case SynRcvd:
		if flags.has(SYN | ACK) {
			return SynRcvd, true
		}
	case Established:
		if flags.has(FIN) {
			return FinWait1, true
		}
		if flags.has(SYN) {
			return 0, false
		}
		return Established, true
	case FinWait1:
		if flags.has(FIN) || flags.has(ACK) {
			return FinWait1, true
		}
	case FinWait2:
		if flags.has(ACK) {
			return FinWait2, true
		}
	case TimeWait:
		if flags.has(ACK) {
			return TimeWait, true
		}
	case CloseWait:
		if flags.has(FIN) {
			return LastAck, true
		}
		return CloseWait, true
	case LastAck:
		if flags&(FIN|ACK) != 0 {
			return LastAck, true
		}
	}
	return 0, false
}

// TCPEntry is a TCP flow table entry: a TCPFlow that both of a port's
// directions may process segments on at once, and whose state a sweep may
// read meanwhile.
type TCPEntry struct {
	mu    sync.Mutex
	flow  TCPFlow       // guarded by mu
	state atomic.Uint32 // flow.state, for readers that do not lock
}

// NewTCPEntry starts tracking a flow on its first segment. OPTE keeps no
// entry for a flow that this leaves Closed, and drops a first segment that
// has no transition from Closed (port/mod.rs:2220-2236).
func NewTCPEntry(dir Direction, flags TCPFlags, seq, ack uint32) (*TCPEntry, TCPState, error) {
	e := &TCPEntry{}
	s, err := e.Process(dir, flags, seq, ack)
	return e, s, err
}

// Process is TCPFlow.Process under the entry's lock.
func (e *TCPEntry) Process(dir Direction, flags TCPFlags, seq, ack uint32) (TCPState, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.flow.Process(dir, flags, seq, ack)
	e.state.Store(uint32(s))
	return s, err
}

// State is the connection's state.
func (e *TCPEntry) State() TCPState { return TCPState(e.state.Load()) }

// TCPConfig is the configuration of a port's TCP flow table (port/mod.rs:341-346):
// each flow idles as long as its state allows, and a full table evicts
// misbehaving and long-idle flows first. limit 0 means DefaultLimit.
func TCPConfig(limit int, now func() time.Time) Config[*TCPEntry] {
	return Config[*TCPEntry]{
		Limit: limit,
		TTLOf: func(e *TCPEntry) time.Duration { return TCPTTL(e.State()) },
		Evict: func(e *TCPEntry, idle time.Duration) Priority { return TCPEviction(e.State(), idle) },
		Now:   now,
	}
}
