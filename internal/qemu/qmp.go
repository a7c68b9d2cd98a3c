package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrDisconnected is the end of a QMP connection that Close did not
	// end: QEMU exited, was killed or closed it.
	ErrDisconnected = errors.New("QMP connection lost")
	// ErrClosed is a QMP connection ended by Close.
	ErrClosed = errors.New("QMP connection closed")
	// ErrNotQMP is a peer whose first words are not a QMP greeting.
	ErrNotQMP = errors.New("not a QMP greeting")
)

// DefaultTimeout bounds Dial and each Execute whose context has no deadline.
const DefaultTimeout = 30 * time.Second

const (
	// maxMessage bounds one QMP message; query-qmp-schema's reply, among
	// the longest, is a few hundred KiB.
	maxMessage = 16 << 20
	// maxQueuedEvents bounds the events waiting for a caller that does
	// not read them; past it the oldest are dropped and counted.
	maxQueuedEvents = 16384
)

// Error is QEMU's answer that a command failed.
type Error struct {
	Command string `json:"-"`
	Class   string `json:"class"` // GenericError, CommandNotFound, DeviceNotActive, …
	Desc    string `json:"desc"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Event is one of QEMU's asynchronous events.
type Event struct {
	Name string          // SHUTDOWN, RESUME, GUEST_PANICKED, …
	Data json.RawMessage // nil for an event without data
	Time time.Time       // QEMU's timestamp
}

// Version is the QEMU version the greeting names.
type Version struct {
	Major, Minor, Micro int
	Package             string
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// Monitor is a QMP connection. Its methods may be called at once from many
// goroutines. Every call has a deadline, and none waits on QEMU while
// holding a lock: a QEMU that hangs holds up only the calls made to it until
// their deadlines, and one that dies ends every call at once.
type Monitor struct {
	conn    net.Conn
	r       *bufio.Reader
	version Version

	sendq   chan []byte   // commands for the writer; unbuffered
	events  chan Event    // fed by the pump from queue
	wake    chan struct{} // capacity 1: the pump has something new to look at
	closing chan struct{} // closed by Close
	done    chan struct{} // closed once the connection has ended and err is set

	nextID    atomic.Uint64
	closeOnce sync.Once
	wg        sync.WaitGroup // the reader, writer and pump

	mu sync.Mutex // guards the fields below; held only to copy them in or out
	// pending holds the reply channel (capacity 1) of each command sent
	// and not yet answered or given up, by id.
	pending map[uint64]chan reply
	queue   []Event // events read and not yet handed to the caller
	dropped uint64  // events dropped from a full queue
	ended   bool    // the reader has stopped
	err     error   // why the connection ended
}

type reply struct {
	ret json.RawMessage
	err *Error // its Command is filled in by Execute
}

// Dial connects to the QMP socket at socketPath, reads QEMU's greeting and
// sends qmp_capabilities, which ends QMP's negotiation mode: commands and
// events flow from then on. A ctx without a deadline gets DefaultTimeout.
func Dial(ctx context.Context, socketPath string) (*Monitor, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	return handshake(ctx, conn)
}

// handshake reads the greeting on conn, starts the monitor's goroutines and
// sends qmp_capabilities. It closes conn if it fails.
func handshake(ctx context.Context, conn net.Conn) (*Monitor, error) {
	// The greeting is read before any goroutine exists; ctx's end makes
	// the read fail at once.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	r := bufio.NewReaderSize(conn, 64<<10)
	line, err := readMessage(r)
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("qmp: no greeting: %w", ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: no greeting: %w", err)
	}
	var g struct {
		QMP *struct {
			Version struct {
				QEMU struct {
					Major, Minor, Micro int
				} `json:"qemu"`
				Package string `json:"package"`
			} `json:"version"`
		} `json:"QMP"`
	}
	if err := json.Unmarshal(line, &g); err != nil || g.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: %w: %.200q", ErrNotQMP, line)
	}
	v := g.QMP.Version
	m := &Monitor{
		conn:    conn,
		r:       r,
		version: Version{v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro, v.Package},
		sendq:   make(chan []byte),
		events:  make(chan Event),
		wake:    make(chan struct{}, 1),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		pending: make(map[uint64]chan reply),
	}
	m.wg.Add(3)
	go m.read()
	go m.write()
	go m.pump()
	if err := m.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Version is the QEMU version from the greeting.
func (m *Monitor) Version() Version { return m.version }

// Execute runs command with args (nil for none; otherwise encoded as the
// command's arguments object) and decodes its return value into result
// (nil to ignore it). QEMU's refusal is an *Error. A ctx without a deadline
// gets DefaultTimeout. Once the connection has ended, Execute fails at once
// with an error wrapping ErrDisconnected or ErrClosed.
func (m *Monitor) Execute(ctx context.Context, command string, args, result any) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	select {
	case <-m.done:
		return fmt.Errorf("qmp %s: %w", command, m.Err())
	default:
	}
	id := m.nextID.Add(1)
	msg, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{command, args, id})
	if err != nil {
		return fmt.Errorf("qmp %s: arguments: %w", command, err)
	}
	ch := make(chan reply, 1)
	m.mu.Lock()
	m.pending[id] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.pending, id)
		m.mu.Unlock()
	}()

	select {
	case m.sendq <- append(msg, '\n'):
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: not sent: %w", command, ctx.Err())
	case <-m.done:
		return fmt.Errorf("qmp %s: %w", command, m.Err())
	}
	var r reply
	select {
	case r = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: no reply: %w", command, ctx.Err())
	case <-m.done:
		select {
		case r = <-ch: // answered just before the end
		default:
			return fmt.Errorf("qmp %s: %w", command, m.Err())
		}
	}
	if r.err != nil {
		r.err.Command = command
		return r.err
	}
	if result != nil {
		if err := json.Unmarshal(r.ret, result); err != nil {
			return fmt.Errorf("qmp %s: reply: %w", command, err)
		}
	}
	return nil
}

// Events delivers QEMU's events in order. The reader queues them, so a
// caller that reads slowly holds up neither replies nor the connection, and
// loses no event while it keeps up. One that stops reading leaves them
// queued; past 16,384 the oldest are dropped (see Dropped). The channel is
// closed after the connection has ended and every queued event has been
// delivered (QEMU's last words, such as SHUTDOWN, come before the end), or
// at Close, which drops what is still queued.
func (m *Monitor) Events() <-chan Event { return m.events }

// Dropped counts the events dropped because nobody read them.
func (m *Monitor) Dropped() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dropped
}

// Done is closed when the connection has ended: QEMU exited, was killed or
// hung up, or Close was called.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err says why the connection ended (wrapping ErrDisconnected or
// ErrClosed), or is nil while it lasts.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close ends the connection and returns once every goroutine of the
// monitor has stopped. Calls in flight fail with ErrClosed. It may be
// called more than once.
func (m *Monitor) Close() error {
	m.closeOnce.Do(func() {
		close(m.closing)
		m.conn.Close()
	})
	m.wg.Wait()
	return nil
}

// read reads messages until the connection ends, hands replies to their
// commands and queues events. It never waits for a caller.
func (m *Monitor) read() {
	defer m.wg.Done()
	var err error
	for {
		var line []byte
		if line, err = readMessage(m.r); err != nil {
			break
		}
		m.dispatch(line)
	}
	select {
	case <-m.closing:
		err = ErrClosed
	default:
		err = fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	m.mu.Lock()
	m.err, m.ended = err, true
	m.mu.Unlock()
	close(m.done)
	m.poke()
	m.conn.Close() // ends a write blocked on a QEMU that stopped reading
}

// dispatch handles one message. Replies to commands whose callers gave up,
// and messages that are neither reply nor event, are dropped.
func (m *Monitor) dispatch(line []byte) {
	var msg struct {
		Event     string          `json:"event"`
		Data      json.RawMessage `json:"data"`
		Timestamp struct {
			Seconds      int64 `json:"seconds"`
			Microseconds int64 `json:"microseconds"`
		} `json:"timestamp"`
		ID     *uint64         `json:"id"`
		Return json.RawMessage `json:"return"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(line, &msg); err != nil {
		return
	}
	if msg.Event != "" {
		ev := Event{
			Name: msg.Event,
			Data: msg.Data,
			Time: time.Unix(msg.Timestamp.Seconds, msg.Timestamp.Microseconds*1000),
		}
		m.mu.Lock()
		if len(m.queue) >= maxQueuedEvents {
			m.queue[0] = Event{}
			m.queue = m.queue[1:]
			m.dropped++
		}
		m.queue = append(m.queue, ev)
		m.mu.Unlock()
		m.poke()
		return
	}
	if msg.ID == nil {
		return
	}
	m.mu.Lock()
	ch := m.pending[*msg.ID]
	delete(m.pending, *msg.ID)
	m.mu.Unlock()
	if ch != nil {
		ch <- reply{ret: msg.Return, err: msg.Error} // capacity 1, one reply per id
	}
}

// write writes commands in the order Execute hands them over. A command is
// written whole or the connection is closed: half a command would garble
// the next.
func (m *Monitor) write() {
	defer m.wg.Done()
	for {
		select {
		case b := <-m.sendq:
			if _, err := m.conn.Write(b); err != nil {
				m.conn.Close() // the reader sees the end and says so
				return
			}
		case <-m.done:
			return
		case <-m.closing:
			return
		}
	}
}

// pump hands queued events to the caller one at a time.
func (m *Monitor) pump() {
	defer m.wg.Done()
	defer close(m.events)
	for {
		m.mu.Lock()
		var ev Event
		have := len(m.queue) > 0
		if have {
			ev = m.queue[0]
			m.queue[0] = Event{}
			m.queue = m.queue[1:]
		}
		ended := m.ended
		m.mu.Unlock()
		if !have {
			if ended {
				return
			}
			select {
			case <-m.wake:
			case <-m.closing:
				return
			}
			continue
		}
		select {
		case m.events <- ev:
		case <-m.closing:
			return
		}
	}
}

func (m *Monitor) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// readMessage reads one line, at most maxMessage bytes, without its newline.
func readMessage(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > maxMessage {
			return nil, fmt.Errorf("a message longer than %d bytes", maxMessage)
		}
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		return bytes.TrimRight(line, "\r\n"), nil
	}
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// Status is the guest's run state as query-status says it.
type Status struct {
	Status  string `json:"status"` // prelaunch, running, paused, shutdown, guest-panicked, …
	Running bool   `json:"running"`
}

// QueryStatus asks for the guest's run state.
func (m *Monitor) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := m.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// Cont runs the guest (from -S, or after Stop). A running guest is left so.
func (m *Monitor) Cont(ctx context.Context) error { return m.Execute(ctx, "cont", nil, nil) }

// Stop pauses the guest's CPUs. A paused guest is left so.
func (m *Monitor) Stop(ctx context.Context) error { return m.Execute(ctx, "stop", nil, nil) }

// SystemReset resets the guest, as its reset button would.
func (m *Monitor) SystemReset(ctx context.Context) error {
	return m.Execute(ctx, "system_reset", nil, nil)
}

// SystemPowerdown asks the guest to power off (an ACPI power button press);
// the guest may ignore it.
func (m *Monitor) SystemPowerdown(ctx context.Context) error {
	return m.Execute(ctx, "system_powerdown", nil, nil)
}

// Quit makes QEMU exit. A connection that ends before the reply arrives
// counts as done: QEMU was on its way out.
func (m *Monitor) Quit(ctx context.Context) error {
	err := m.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrDisconnected) {
		return nil
	}
	return err
}
