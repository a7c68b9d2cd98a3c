package flow

import (
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

type seg struct {
	dir   Direction
	flags TCPFlags
	seq   uint32
	ack   uint32
	want  TCPState
	err   error // ErrNewFlow, ErrUnexpectedSegment or nil
}

// The tracker's transitions, each from lib/opte/src/engine/tcp_state.rs
// (flow_in :138-348, flow_out :354-489, process :501-584).
func TestTCPTransitions(t *testing.T) {
	handshakeOut := []seg{ // guest opens: :365, :194
		{Out, SYN, 100, 0, SynSent, nil},
		{In, SYN | ACK, 900, 101, Established, nil},
		{Out, ACK, 101, 901, Established, nil},
	}
	for _, tc := range []struct {
		name string
		segs []seg
	}{
		{"guest opens", handshakeOut},
		{"guest retransmits its SYN", []seg{ // :391
			{Out, SYN, 100, 0, SynSent, nil},
			{Out, SYN, 100, 0, SynSent, nil},
		}},
		{"remote opens", []seg{ // :173, :382, :206
			{In, SYN, 900, 0, Listen, nil},
			{In, SYN, 900, 0, Listen, nil},
			{Out, SYN | ACK, 100, 901, SynRcvd, nil},
			{In, SYN, 900, 0, SynRcvd, nil},
			{Out, SYN | ACK, 100, 901, SynRcvd, nil},
			{In, ACK, 901, 101, Established, nil},
		}},
		{"a forgotten connection is established on any ACK", []seg{ // :166, :371
			{In, ACK | PSH, 5000, 7000, Established, nil},
		}},
		{"guest closes first, remote ACK then FIN", append(slices.Clone(handshakeOut), []seg{ // :411, :293, :311, :456
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{In, ACK, 901, 150, FinWait1, nil}, // acks earlier data
			{In, ACK, 901, 201, FinWait2, nil},
			{In, ACK | PSH, 901, 201, FinWait2, nil},
			{In, FIN | ACK, 950, 201, TimeWait, nil},
			{Out, ACK, 201, 951, TimeWait, nil},
			{In, FIN | ACK, 950, 201, TimeWait, nil},
		}...)},
		// The FIN's ack is checked against the last sequence number the
		// guest sent plus one (:312), and a guest ACK after its own FIN
		// moves that on (:529): OPTE then stays in FIN_WAIT_2, whose TTL
		// is TIME_WAIT's.
		{"a guest ACK after its FIN keeps FIN_WAIT_2", append(slices.Clone(handshakeOut), []seg{
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{In, ACK, 901, 201, FinWait2, nil},
			{Out, ACK, 201, 901, FinWait2, nil},
			{In, FIN | ACK, 950, 201, FinWait2, nil},
		}...)},
		{"guest closes, remote sends FIN and ACK at once", append(slices.Clone(handshakeOut), []seg{ // :286
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{In, FIN | ACK, 950, 201, TimeWait, nil},
		}...)},
		{"a FIN in FIN_WAIT_2 not acking the guest's FIN", append(slices.Clone(handshakeOut), []seg{ // :311-326
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{In, ACK, 901, 201, FinWait2, nil},
			{In, FIN | ACK, 950, 150, FinWait2, nil},
			{In, FIN, 950, 150, FinWait2, ErrUnexpectedSegment},
		}...)},
		{"remote closes first", append(slices.Clone(handshakeOut), []seg{ // :226, :249, :475, :467, :268
			{In, FIN | ACK, 950, 101, CloseWait, nil},
			{Out, ACK, 101, 951, CloseWait, nil},
			{In, FIN | ACK, 950, 101, CloseWait, nil},
			{Out, PSH | ACK, 101, 951, CloseWait, nil},
			{Out, FIN | ACK, 300, 951, LastAck, nil},
			{Out, FIN | ACK, 300, 951, LastAck, nil},
			{In, ACK, 951, 250, LastAck, nil},
			{In, ACK, 951, 301, Closed, nil},
		}...)},
		{"RST from the guest closes any state", append(slices.Clone(handshakeOut), // :357
			seg{Out, RST, 101, 0, Closed, nil})},
		{"RST from the remote closes any state", []seg{ // :145
			{Out, SYN, 100, 0, SynSent, nil},
			{In, RST | ACK, 0, 101, Closed, nil},
		}},
		{"a SYN on an established flow reopens it", append(slices.Clone(handshakeOut), // :229, :414, :556
			seg{In, SYN, 5, 0, Established, ErrNewFlow},
			seg{Out, SYN, 5, 0, Established, ErrNewFlow},
		)},
		{"a SYN in TIME_WAIT reopens it", append(slices.Clone(handshakeOut), []seg{ // :449-461, :540-563
			{Out, FIN | ACK, 200, 901, FinWait1, nil},
			{In, FIN | ACK, 950, 201, TimeWait, nil},
			{Out, SYN, 7000, 0, TimeWait, ErrNewFlow},
		}...)},
		{"segments with no transition", []seg{
			{In, FIN, 1, 0, Closed, ErrUnexpectedSegment},      // :177
			{Out, FIN, 1, 0, Closed, ErrUnexpectedSegment},     // :375
			{Out, SYN, 100, 0, SynSent, nil},                   //
			{In, ACK, 900, 101, SynSent, ErrUnexpectedSegment}, // :194-199: needs SYN and ACK
			{Out, ACK, 100, 0, SynSent, ErrUnexpectedSegment},  // :391-395
			{In, SYN, 900, 0, SynSent, ErrNewFlow},             // simultaneous open, :197
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f TCPFlow
			for i, s := range tc.segs {
				got, err := f.Process(s.dir, s.flags, s.seq, s.ack)
				if got != s.want || f.State() != s.want || !errors.Is(err, s.err) || (err == nil) != (s.err == nil) {
					t.Fatalf("segment %d (%v %#x): %v, %v; want %v, %v", i, s.dir, uint8(s.flags), got, err, s.want, s.err)
				}
				var se *SegmentError
				if err != nil && (!errors.As(err, &se) || se.State != s.want || se.Dir != s.dir || se.Flags != s.flags) {
					t.Fatalf("segment %d: error %v does not say the state, direction and flags", i, err)
				}
			}
		})
	}
}

// A TCP flow idles as long as its state allows (port/mod.rs:3240-3259 with
// tcp.rs:25-40): 5 s in the handshake, 120 s closing, 8000 s established,
// and a closed flow goes at the next sweep.
func TestTCPExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](TCPConfig(0, nil))
		start := time.Now()
		open := func(p uint16, segs ...seg) {
			e := &TCPEntry{}
			for _, s := range segs {
				if _, err := e.Process(s.dir, s.flags, s.seq, s.ack); err != nil {
					t.Fatal(err)
				}
			}
			tb.Insert(k(p), e)
		}
		open(1, seg{dir: Out, flags: SYN})                                  // SYN_SENT
		open(2, seg{dir: Out, flags: ACK})                                  // ESTABLISHED
		open(3, seg{dir: Out, flags: ACK}, seg{dir: Out, flags: FIN | ACK}) // FIN_WAIT_1
		open(4, seg{dir: Out, flags: ACK}, seg{dir: In, flags: RST})        // CLOSED
		open(5, seg{dir: In, flags: ACK}, seg{dir: In, flags: FIN | ACK})   // CLOSE_WAIT
		open(6, seg{dir: In, flags: SYN}, seg{dir: Out, flags: SYN | ACK})  // SYN_RCVD
		open(7, seg{dir: In, flags: SYN})                                   // LISTEN
		open(8, seg{dir: Out, flags: ACK}, seg{dir: Out, flags: FIN | ACK, seq: 5},
			seg{dir: In, flags: ACK, ack: 6}) // FIN_WAIT_2
		open(9, seg{dir: Out, flags: ACK}, seg{dir: Out, flags: FIN | ACK, seq: 5},
			seg{dir: In, flags: FIN | ACK, ack: 6}) // TIME_WAIT
		open(10, seg{dir: In, flags: ACK}, seg{dir: In, flags: FIN | ACK},
			seg{dir: Out, flags: FIN | ACK}) // LAST_ACK

		for _, step := range []struct {
			at   time.Duration
			gone []uint16
		}{
			{0, []uint16{4}},
			{TCPIncipientTTL - time.Millisecond, nil},
			{TCPIncipientTTL, []uint16{1, 6, 7, 10}},
			{TCPTimeWaitTTL - time.Millisecond, nil},
			{TCPTimeWaitTTL, []uint16{3, 5, 8, 9}},
			{TCPKeepaliveTTL - time.Millisecond, nil},
			{TCPKeepaliveTTL, []uint16{2}},
		} {
			time.Sleep(time.Until(start.Add(step.at)))
			var got []uint16
			for _, e := range tb.Expire() {
				got = append(got, e.Key.srcPort)
			}
			slices.Sort(got)
			if !slices.Equal(got, step.gone) {
				t.Fatalf("at %v expired %v, want %v", step.at, got, step.gone)
			}
		}
		if tb.Len() != 0 {
			t.Fatalf("%d left", tb.Len())
		}
	})
}

// A state change moves the flow onto its new state's TTL: an established
// flow the guest closes has 120 s, not 8000 s, from its last segment.
func TestTCPExpiryFollowsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](TCPConfig(0, nil))
		e, s, err := NewTCPEntry(Out, ACK, 1, 1)
		if err != nil || s != Established {
			t.Fatalf("new entry: %v, %v", s, err)
		}
		tb.Insert(k(1), e)
		time.Sleep(time.Hour)
		if v, ok := tb.Lookup(k(1)); !ok {
			t.Fatal("established flow expired within an hour")
		} else if s, _ := v.Process(Out, FIN|ACK, 2, 1); s != FinWait1 {
			t.Fatalf("after FIN: %v", s)
		}
		time.Sleep(TCPTimeWaitTTL - time.Second)
		if gone := tb.Expire(); len(gone) != 0 {
			t.Fatal("closing flow expired early")
		}
		time.Sleep(time.Second)
		if gone := tb.Expire(); len(gone) != 1 || gone[0].Value.State() != FinWait1 {
			t.Fatalf("expired %+v", gone)
		}
	})
}

// OPTE's priority_lerp cases (flow_table.rs:1178-1213).
func TestLerp(t *testing.T) {
	for _, tc := range []struct {
		delta uint64
		want  Priority
	}{
		{750, 15}, {975, 19}, {976, 20}, {501, 10}, {999, 20}, {200, 10}, {10_000, 20},
	} {
		if got := lerp(500, 10, 1000, 20, tc.delta); got != tc.want {
			t.Errorf("lerp(500, 10, 1000, 20, %d) = %d, want %d", tc.delta, got, tc.want)
		}
	}
}

// Which TCP flows a full table may evict, and how eagerly
// (port/mod.rs:3261-3342).
func TestTCPEviction(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		state TCPState
		idle  time.Duration
		want  Priority
	}{
		{TimeWait, TCPIncipientTTL, Protected},
		{FinWait2, TCPIncipientTTL + ms, misbehavedMin},
		{CloseWait, TCPTimeWaitTTL, misbehavedMax},
		{FinWait1, time.Hour, misbehavedMax},
		{SynSent, 2500 * ms, Protected},
		{Listen, 2500 * ms, Protected},
		{Listen, 2501 * ms, 28},     // 2 + round(65532 * 1/2500)
		{SynRcvd, 3750 * ms, 32768}, // midway: 2 + 65532/2
		{LastAck, TCPIncipientTTL, misbehavedMax},
		{Established, DefaultTTL - ms, Protected},
		{Established, DefaultTTL, MinEvictable},
		{Closed, 0, MaxEvictable},
	} {
		if got := TCPEviction(tc.state, tc.idle); got != tc.want {
			t.Errorf("%v idle %v: %d, want %d", tc.state, tc.idle, got, tc.want)
		}
	}
}

// A full TCP table makes room by evicting a stuck handshake before an idle
// established flow, and refuses a new flow while every flow is healthy.
func TestTCPTableFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](TCPConfig(2, nil))
		est, _, _ := NewTCPEntry(Out, ACK, 1, 1)
		syn, _, _ := NewTCPEntry(Out, SYN, 1, 0)
		tb.Insert(k(1), est)
		tb.Insert(k(2), syn)
		fresh, _, _ := NewTCPEntry(Out, SYN, 9, 0)
		if _, _, err := tb.Insert(k(3), fresh); !errors.Is(err, ErrFull) {
			t.Fatalf("healthy full table: %v", err)
		}
		time.Sleep(4 * time.Second)
		gone, ok, err := tb.Insert(k(3), fresh)
		if err != nil || !ok || gone.Key != k(2) {
			t.Fatalf("evicted %+v, %v, %v; want the stuck SYN", gone, ok, err)
		}
	})
}
