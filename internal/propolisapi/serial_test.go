package propolisapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// Serial history answers as upstream's history buffer does, in the cases
// of upstream's own test of it (a buffer of 16 bytes at each end): reads
// from the start and from the end, clamped offsets, max_bytes, the first
// part read only to its end once the parts no longer touch, and bytes no
// longer held refused.
func TestSerialHistoryUpstreamCases(t *testing.T) {
	e := newEnv(t, 16)
	e.ensure(t)
	ctx := t.Context()
	type read struct {
		off  propolisapi.SerialOffset
		max  int
		data string
		end  uint64
	}
	check := func(stage string, reads ...read) {
		t.Helper()
		for _, r := range reads {
			data, end, err := e.client.SerialHistory(ctx, r.off, r.max)
			if err != nil || string(data) != r.data || end != r.end {
				t.Errorf("%s: %+v max %d = %q %d %v, want %q %d", stage, r.off, r.max, data, end, err, r.data, r.end)
			}
		}
	}
	from, recent := propolisapi.SerialFromStart, propolisapi.SerialMostRecent
	check("empty", read{from(0), 0, "", 0}, read{from(0), 11, "", 0}, read{from(11), 11, "", 0})

	const line = "This is an example of text."
	buf := e.fake.Buffer()
	buf.Append([]byte(line[:9]))
	check("9 bytes", read{from(8), 5, "a", 9})
	buf.Append([]byte(line[9:]))
	check("a line",
		read{from(0), 0, line, 27},
		read{from(0), 37, line, 27},
		read{from(8), 5, "an ex", 13},
		read{from(100), 10, "", 27},
		read{recent(10), 4, "e of", 21},
		read{recent(10), 400, "e of text.", 27},
		read{recent(100), 4, "This", 4},
	)
	buf.Append([]byte("\nNo thing beside remains."))
	check("past both parts",
		read{recent(10), 4, "e re", 46},
		read{from(8), 8, "an examp", 16},
		read{from(8), 12, "an examp", 16},
		read{from(36), 0, " beside remains.", 52},
	)
	_, _, err := e.client.SerialHistory(ctx, from(16), 0)
	var ae *propolisapi.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Message, "Requested byte offset 16 (-36) is no longer cached") {
		t.Errorf("bytes no longer held: %v", err)
	}

	a := e.raw(t, "GET", "/instance/serial/history?from_start=2&max_bytes=0", "")
	if a.status != 200 || string(a.body) != `{"data":[],"last_byte_offset":2}` {
		t.Errorf("max_bytes=0: %d %s", a.status, a.body)
	}
	for _, q := range []string{"", "?max_bytes=4", "?from_start=1&most_recent=1"} {
		wantError(t, "history"+q, e.raw(t, "GET", "/instance/serial/history"+q, ""), 400, "-",
			"Exactly one of 'from_start' or 'most_recent' must be specified.")
	}
	wantError(t, "a bad offset", e.raw(t, "GET", "/instance/serial/history?from_start=x", "", invalid), 400, "-", "from_start")
	wantError(t, "a repeated offset", e.raw(t, "GET", "/instance/serial/history?from_start=1&from_start=2", ""), 400, "-", "duplicate field `from_start`")
	e.proxy.WantSeen("GET /instance/serial/history 200", "GET /instance/serial/history 400")
}

// Without max_bytes, history answers 16 KiB, as upstream's.
func TestSerialHistoryDefaultMax(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	out := pattern(0, 40<<10)
	e.fake.Buffer().Append(out)
	data, end, err := e.client.SerialHistory(t.Context(), propolisapi.SerialFromStart(100), 0)
	if err != nil || !bytes.Equal(data, out[100:100+16<<10]) || end != 100+16<<10 {
		t.Errorf("SerialHistory = %d bytes, end %d, %v", len(data), end, err)
	}
}

// readN reads output from c until it has n bytes, or fails the test.
func readN(t *testing.T, c *propolisapi.SerialConn, n int) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var got []byte
	for len(got) < n {
		p, err := c.ReadOutput(ctx)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", len(got), n, err)
		}
		got = append(got, p...)
	}
	if len(got) > n {
		t.Fatalf("read %q, want %d bytes", got, n)
	}
	return got
}

// Output reaches every reader in order, from the offset each asked for;
// input from any of them reaches the guest; when the VM stops, the server
// closes every console with 1001 "VM stopped".
func TestSerialConsole(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	ctx := t.Context()
	buf := e.fake.Buffer()
	buf.Append([]byte("booting\n"))
	fromStart, err := e.client.SerialConnect(ctx, propolisapi.SerialFromStart(4))
	if err != nil {
		t.Fatal(err)
	}
	defer fromStart.Close()
	recent, err := e.client.SerialConnect(ctx, propolisapi.SerialMostRecent(2))
	if err != nil {
		t.Fatal(err)
	}
	defer recent.Close()
	live, err := e.client.SerialConnect(ctx, propolisapi.SerialOffset{})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if got := readN(t, fromStart, 4); string(got) != "ing\n" {
		t.Errorf("from_start=4: %q", got)
	}
	if got := readN(t, recent, 2); string(got) != "g\n" {
		t.Errorf("most_recent=2: %q", got)
	}
	for _, s := range []string{"login: ", "", "password: "} {
		buf.Append([]byte(s))
		for name, c := range map[string]*propolisapi.SerialConn{"from_start": fromStart, "most_recent": recent, "live": live} {
			if got := readN(t, c, len(s)); string(got) != s {
				t.Errorf("%s: %q, want %q", name, got, s)
			}
		}
	}

	if err := fromStart.WriteInput(ctx, []byte("root\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first input", func() bool { return string(e.fake.Input()) == "root\n" })
	if err := live.WriteInput(ctx, []byte("hunter2\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second input", func() bool { return string(e.fake.Input()) == "root\nhunter2\n" })

	if err := e.client.PutState(ctx, propolisapi.RequestStop); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*propolisapi.SerialConn{fromStart, recent, live} {
		_, err := c.ReadOutput(ctx)
		if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "VM stopped") {
			t.Errorf("after the VM stopped: %v", err)
		}
	}
	e.proxy.WantSeen("GET /instance/serial 101")
}

// A reader whose offset falls between the parts of the history, or whose
// history is gone, is told at the upgrade; one reading from the start of
// a history with a gap gets the first part and then the recent part.
func TestSerialConsoleHistoryGaps(t *testing.T) {
	e := newEnv(t, 16)
	e.ensure(t)
	out := pattern(0, 40)
	e.fake.Buffer().Append(out)
	_, err := e.client.SerialConnect(t.Context(), propolisapi.SerialFromStart(20))
	var ae *propolisapi.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Message, "no longer cached") {
		t.Errorf("a console from bytes no longer held: %v", err)
	}
	c, err := e.client.SerialConnect(t.Context(), propolisapi.SerialFromStart(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := append(bytes.Clone(out[:16]), out[24:]...)
	if got := readN(t, c, len(want)); !bytes.Equal(got, want) {
		t.Errorf("from the start of a history with a gap: %v, want %v", got, want)
	}
	e.proxy.WantSeen("GET /instance/serial 400")
}

// A request that is no websocket upgrade, or whose offset is no number,
// is refused in dropshot's terms.
func TestSerialConsoleRefusals(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	wantError(t, "no upgrade", e.raw(t, "GET", "/instance/serial?from_start=0", ""), 400, "-", "expected connection upgrade")
	wantError(t, "another protocol", e.raw(t, "GET", "/instance/serial", "", header("Connection", "Upgrade"), header("Upgrade", "h2c")),
		400, "-", "unexpected protocol for upgrade")
	wantError(t, "a bad offset", e.raw(t, "GET", "/instance/serial?most_recent=-1", "", invalid), 400, "-", "most_recent")
	e.proxy.WantSeen("GET /instance/serial 400")
}

// A reader that reads nothing never holds up another: while one takes
// nothing, the other gets every byte of far more output than the sockets
// between the server and the idle reader hold. The idle reader, when it
// reads at last, gets what it was sent in order and resumes past what the
// history no longer held.
func TestSerialConsoleIdleReaderDoesNotBlockOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("moves tens of mebibytes")
	}
	e := newEnv(t, 1<<20)
	e.ensure(t)
	ctx := t.Context()
	// The idle reader connects to the server directly: the proxy's
	// buffers would hide its backlog.
	idle, err := propolisapi.NewClient(strings.TrimPrefix(e.direct, "http://")).SerialConnect(ctx, propolisapi.SerialOffset{})
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	busy, err := e.client.SerialConnect(ctx, propolisapi.SerialOffset{})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	const chunk, total = 256 << 10, 32 << 20
	buf := e.fake.Buffer()
	for off := 0; off < total; off += chunk {
		p := pattern(uint64(off), chunk)
		buf.Append(p)
		if got := readN(t, busy, chunk); !bytes.Equal(got, p) {
			t.Fatalf("the busy reader at %d: wrong bytes", off)
		}
	}
	// The console ends: the idle reader then reads to its end.
	if err := e.client.PutState(ctx, propolisapi.RequestStop); err != nil {
		t.Fatal(err)
	}
	var got int
	var last byte
	for {
		p, err := idle.ReadOutput(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the idle reader after %d bytes: %v", got, err)
		}
		if got == 0 && p[0] != 0 {
			t.Fatalf("the idle reader's first byte is %d, not the first of the output", p[0])
		}
		for i, c := range p {
			if i > 0 && c != byte((int(p[i-1])+1)%251) {
				t.Fatalf("the idle reader's message %d bytes in breaks the output's order at %d", got, i)
			}
		}
		got += len(p)
		last = p[len(p)-1]
	}
	if got >= total || last != byte((total-1)%251) {
		t.Errorf("the idle reader got %d of %d bytes ending in %d: it never lagged past the history, or missed the end", got, total, last)
	}
}

// Text messages from a client are ignored, as upstream's server ignores
// them; binary ones are input. A failed write to the guest closes the
// console with 1011; the server's shutdown closes it with 1001.
func TestSerialConsoleInputAndClosing(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	ctx := t.Context()
	ws, _, err := websocket.Dial(ctx, e.proxy.URL+"/instance/serial", &websocket.DialOptions{
		HTTPHeader: http.Header{"api-version": {propolisapi.APIVersion}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	for _, m := range []struct {
		typ websocket.MessageType
		p   string
	}{{websocket.MessageText, `{"Migrating":{}}`}, {websocket.MessageBinary, "ls\n"}} {
		if err := ws.Write(ctx, m.typ, []byte(m.p)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the binary input", func() bool { return string(e.fake.Input()) == "ls\n" })

	e.fake.FailInput(errors.New("the UART is gone"))
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusInternalError {
		t.Errorf("after a failed write to the guest: %v", err)
	}
	e.fake.FailInput(nil)

	c, err := e.client.SerialConnect(ctx, propolisapi.SerialOffset{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e.shutdown()
	_, err = c.ReadOutput(ctx)
	if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "server shutting down") {
		t.Errorf("at the server's shutdown: %v", err)
	}
}
