package sim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
)

func TestStateOutlivesTheRuntime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sim-state.json")
	rt, err := sim.Open(sim.Options{StateFile: file})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		if err := rt.Ensure(ctx, spec(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Destroy(ctx, spec(2).Name); err != nil {
		t.Fatal(err)
	}
	// A start cut short: the zone is left half-made.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{spec(3).ID: {Start: "hang"}}}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Ensure(short, spec(3)); err == nil {
		t.Fatal("a hanging start succeeded")
	}
	leftover := sim.Leftover{Kind: "link", Zone: spec(9).Name}
	if err := rt.AddLeftover(leftover); err != nil {
		t.Fatal(err)
	}
	inc0, _ := rt.Incarnation(spec(0).Name)

	again, err := sim.Open(sim.Options{StateFile: file})
	if err != nil {
		t.Fatal(err)
	}
	got := names(t, again)
	want := map[string]bool{spec(0).Name: true, spec(1).Name: true, spec(3).Name: false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("zones after reopening %v, want %v", got, want)
	}
	if n, _ := again.Incarnation(spec(0).Name); n != inc0 {
		t.Errorf("incarnation %d after reopening, want %d", n, inc0)
	}
	if got := again.Leftovers(); !slices.Equal(got, []sim.Leftover{leftover}) {
		t.Errorf("leftovers after reopening %v", got)
	}
	// New zones get new incarnations, never one seen before.
	if err := again.Ensure(ctx, spec(4)); err != nil {
		t.Fatal(err)
	}
	if n, _ := again.Incarnation(spec(4).Name); n <= inc0 {
		t.Errorf("new zone's incarnation %d is not above %d", n, inc0)
	}
	removed, err := again.Sweep(ctx)
	if err != nil || !slices.Equal(removed, []string{"link of zone " + spec(9).Name}) {
		t.Fatalf("Sweep = %v, %v", removed, err)
	}
	third, err := sim.Open(sim.Options{StateFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if got := third.Leftovers(); len(got) != 0 {
		t.Errorf("swept leftovers came back: %v", got)
	}
}

func TestCorruptStateIsAnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sim-state.json")
	if err := os.WriteFile(file, []byte(`{"zones": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Open(sim.Options{StateFile: file}); err == nil {
		t.Fatal("a corrupt state file was accepted")
	}
}
