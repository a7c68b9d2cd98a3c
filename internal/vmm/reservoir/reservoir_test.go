package reservoir

import (
	"errors"
	"strings"
	"testing"
)

func TestSize(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		ram     uint64
		pct     int
		mib     uint64
		want    uint64
		wantErr string
	}{
		{ram: 24 * gib, want: 24 * gib * 60 / 100 / Align * Align},
		{ram: 24 * gib, pct: 91, want: 23450521436 / Align * Align},
		{ram: 24 * gib, mib: 1025, want: 1024 << 20},
		{ram: 24 * gib, mib: 1, want: 0},
		{ram: 24 * gib, pct: 100, wantErr: "want 1 to 99"},
		{ram: 24 * gib, pct: -1, wantErr: "want 1 to 99"},
		{ram: 24 * gib, pct: 10, mib: 10, wantErr: "not both"},
		{ram: 1 * gib, mib: 2048, wantErr: "more than the sled's 1024 MiB"},
	} {
		got, err := Size(tc.ram, tc.pct, tc.mib)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Size(%d, %d, %d) = %d, %v; want an error saying %q", tc.ram, tc.pct, tc.mib, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || got%Align != 0 {
			t.Errorf("Size(%d, %d, %d) = %d, %v; want %d", tc.ram, tc.pct, tc.mib, got, err, tc.want)
		}
	}
}

func TestAccount(t *testing.T) {
	a := NewAccount(1024 << 20)
	if err := a.Reserve("a", 512<<20); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve("a", 512<<20); err != nil {
		t.Fatalf("the same again: %v", err)
	}
	if err := a.Reserve("a", 256<<20); err == nil {
		t.Fatal("another amount for the same VMM was taken")
	}
	err := a.Reserve("b", 768<<20)
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "512 MiB of the sled's 1024 MiB are left") {
		t.Fatalf("over the reservoir: %v", err)
	}
	if err := a.Reserve("b", 512<<20); err != nil {
		t.Fatal(err)
	}
	if a.Used() != 1024<<20 {
		t.Fatalf("used %d", a.Used())
	}
	a.Release("a")
	a.Release("a")
	if a.Used() != 512<<20 {
		t.Fatalf("used %d after release", a.Used())
	}
}
