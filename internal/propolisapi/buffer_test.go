package propolisapi_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// model is what a buffer of size must answer, from everything ever
// written: upstream's history keeps the first size bytes and the last size
// bytes, reads the first part only up to its end once the parts no longer
// touch, and starts a read between the parts at the recent part.
func model(all []byte, size int, from uint64, max int) ([]byte, uint64) {
	end := uint64(len(all))
	if from >= end {
		return nil, end
	}
	limit := end
	start := from
	switch ringStart := end - min(end, uint64(size)); {
	case end <= 2*uint64(size) || from >= ringStart:
	case from < uint64(size):
		limit = uint64(size)
	default:
		start = ringStart
	}
	if max <= 0 {
		return nil, start
	}
	return all[start:min(limit, start+uint64(max))], start
}

func pattern(off uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte((off + uint64(i)) % 251)
	}
	return p
}

// Every read of every offset, at every point of a long run of appends of
// every size (bigger than the buffer too), answers as the model does.
func TestBufferMatchesModelThroughWraparound(t *testing.T) {
	for _, size := range []int{1, 4, 7, 16} {
		b := propolisapi.NewBuffer(size, nil)
		var all []byte
		rng := rand.New(rand.NewPCG(1, uint64(size)))
		for step := range 60 {
			n := rng.IntN(3*size + 2)
			if step%10 == 0 {
				n = 0
			}
			p := pattern(uint64(len(all)), n)
			b.Append(p)
			all = append(all, p...)
			if got := b.End(); got != uint64(len(all)) {
				t.Fatalf("size %d step %d: End = %d, want %d", size, step, got, len(all))
			}
			for from := uint64(0); from <= uint64(len(all))+2; from++ {
				for _, max := range []int{0, 1, 3, size, 2*size + 1, 1 << 20} {
					got, gotStart := b.Read(from, max)
					want, wantStart := model(all, size, from, max)
					if gotStart != wantStart || !bytes.Equal(got, want) {
						t.Fatalf("size %d end %d: Read(%d, %d) = %v at %d, want %v at %d",
							size, len(all), from, max, got, gotStart, want, wantStart)
					}
				}
			}
		}
	}
}

// The default size is upstream's mebibyte at each end.
func TestBufferDefaultSize(t *testing.T) {
	b := propolisapi.NewBuffer(0, nil)
	const mib = 1 << 20
	b.Append(pattern(0, 3*mib))
	if got, start := b.Read(mib-1, 1); start != mib-1 || !bytes.Equal(got, pattern(mib-1, 1)) {
		t.Errorf("the first mebibyte's last byte: %v at %d", got, start)
	}
	if _, start := b.Read(mib, 1); start != 2*mib {
		t.Errorf("a byte between the parts: start %d, want %d", start, 2*mib)
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Notify's channel is closed at once when there is output past the
// offset, and otherwise at the next append or at Close; after Close every
// channel is closed.
func TestBufferNotify(t *testing.T) {
	b := propolisapi.NewBuffer(8, nil)
	at0 := b.Notify(0)
	if closed(at0) {
		t.Fatal("Notify(0) of an empty buffer is closed")
	}
	b.Append(nil)
	if closed(at0) {
		t.Fatal("an empty append woke a waiter")
	}
	b.Append([]byte("ab"))
	if !closed(at0) {
		t.Fatal("an append did not wake a waiter")
	}
	if !closed(b.Notify(1)) {
		t.Fatal("Notify(1) with output up to 2 is not closed")
	}
	at2 := b.Notify(2)
	if closed(at2) {
		t.Fatal("Notify(End) is closed")
	}
	b.Close()
	if !closed(at2) {
		t.Fatal("Close did not wake a waiter")
	}
	if !closed(b.Notify(100)) {
		t.Fatal("Notify after Close is not closed")
	}
	b.Close() // idempotent
	b.Append([]byte("c"))
	if got, _ := b.Read(0, 10); string(got) != "abc" {
		t.Errorf("output after Close: %q", got)
	}
}

// Readers that follow the output with Notify and Read, while a writer
// appends as fast as it can, see every byte at its offset, in order, and
// skip only forward, past bytes no longer held.
func TestBufferConcurrentReaders(t *testing.T) {
	const size, total, readers = 64, 200_000, 4
	b := propolisapi.NewBuffer(size, nil)
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for r := range readers {
		wg.Go(func() {
			off := uint64(0)
			var skipped, got uint64
			for off < total {
				data, start := b.Read(off, 1+r*7)
				if start < off {
					errs <- errors.New("a read went backwards")
					return
				}
				skipped += start - off
				if !bytes.Equal(data, pattern(start, len(data))) {
					errs <- errors.New("a byte at the wrong offset")
					return
				}
				got += uint64(len(data))
				off = start + uint64(len(data))
				if len(data) == 0 {
					<-b.Notify(off)
				}
			}
			if got+skipped != total {
				errs <- errors.New("bytes lost without a skip")
			}
		})
	}
	rng := rand.New(rand.NewPCG(2, 2))
	for off := 0; off < total; {
		n := min(total-off, 1+rng.IntN(2*size))
		b.Append(pattern(uint64(off), n))
		off += n
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("readers did not reach the end")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Input goes to the write func; a buffer without one refuses input.
func TestBufferWrite(t *testing.T) {
	if _, err := propolisapi.NewBuffer(8, nil).Write(context.Background(), []byte("x")); !errors.Is(err, propolisapi.ErrNoInput) {
		t.Errorf("Write without a writer: %v", err)
	}
	var got []byte
	b := propolisapi.NewBuffer(8, func(ctx context.Context, p []byte) (int, error) {
		got = append(got, p...)
		return len(p), nil
	})
	if n, err := b.Write(context.Background(), []byte("hi")); n != 2 || err != nil || string(got) != "hi" {
		t.Errorf("Write = %d, %v; the guest got %q", n, err, got)
	}
}
